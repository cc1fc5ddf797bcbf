package plugin

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"

	"github.com/sluice-proxy/sluice/filter/internal/fleetclient"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit/siphash"
)

// hashKeyKey is the shared-data key of the SipHash key that maps counter
// keys to buckets, the same in every VM of an Envoy.
const hashKeyKey = "sluice/hashkey"

// casAbsent is the cas passed when writing a key that was absent when read
// (fleetclient.CASAbsent). See the package doc for the residual case.
const casAbsent = fleetclient.CASAbsent

// loadHashKey reads the hash key from shared data. When it is absent (or
// malformed) and create is set, it stores 16 fresh random bytes with
// casAbsent and reads back whatever is stored, so that racing VMs converge
// on the first write. The canary VM (which Envoy configures before the
// workers) normally creates it; every VM also re-reads it on each tick.
//
// Residual race: a VM that read a malformed value and overwrites it with
// its cas can race with another doing the same; both re-read and the last
// write wins, and the tick makes the loser switch within one period.
func (p *pluginContext) loadHashKey(create bool) {
	v, cas, err := proxywasm.GetSharedData(hashKeyKey)
	if err == nil {
		if k, ok := siphash.KeyFromBytes(v); ok {
			if p.hashKeyOK && k != p.hashKey {
				proxywasm.LogInfo("sluice: hash key changed in shared data; switching")
			}
			p.hashKey, p.hashKeyOK = k, true
			return
		}
	} else if !errors.Is(err, proxywasm.ErrNotFound) {
		proxywasm.LogWarn("sluice: reading the hash key: " + err.Error())
		return
	} else {
		cas = casAbsent
	}
	if !create {
		return
	}
	var fresh [siphash.Size]byte
	binary.LittleEndian.PutUint64(fresh[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(fresh[8:], rand.Uint64())
	if err := proxywasm.SetSharedData(hashKeyKey, fresh[:], cas); err != nil && !errors.Is(err, proxywasm.ErrCasMismatch) {
		proxywasm.LogWarn("sluice: storing the hash key: " + err.Error())
		return
	}
	p.loadHashKey(false)
}
