package plugin

// The quota client's host: shared data and the quota call, through the
// proxy-wasm binding; and the plugin's side of an answer (resuming waiters).

import (
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/filter/internal/fleetclient"
	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/limit"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// quotaHost implements fleetclient.Host with the proxy-wasm ABI.
type quotaHost struct{ p *pluginContext }

func (quotaHost) GetSharedData(key string) ([]byte, uint32, error) {
	return proxywasm.GetSharedData(key)
}

func (quotaHost) SetSharedData(key string, value []byte, cas uint32) error {
	return proxywasm.SetSharedData(key, value, cas)
}

func (quotaHost) Debug(msg string) { proxywasm.LogDebug(msg) }

func (quotaHost) Now() int64 { return clockNow() }

// Call dispatches the quota request on the control_plane cluster
// (proxy_http_call from the root context) and reads the answer in its
// callback: the :status header and a body of at most maxQuotaAnswerBytes.
func (q quotaHost) Call(body []byte, timeout time.Duration, onAnswer func(status string, body []byte)) error {
	cp := q.p.cfg.ControlPlane
	headers := [][2]string{
		{":method", "POST"}, {":path", quotaPath}, {":authority", cp.Authority},
		{"content-type", "application/json"}, {quota.EnvoysHeader, "1"}, {quota.ChargeHeader, "1"}, {quota.LeftHeader, "1"},
	}
	if cp.QuotaToken != "" {
		headers = append(headers, [2]string{"authorization", "Bearer " + cp.QuotaToken})
	}
	_, err := proxywasm.DispatchRootHttpCall(cp.Cluster, headers, body, nil, uint32(timeout.Milliseconds()),
		func(numHeaders, bodySize, _ int) {
			if numHeaders == 0 {
				onAnswer("", nil)
				return
			}
			status, _ := proxywasm.GetHttpCallResponseHeader(":status")
			if status != "200" {
				onAnswer(status, nil)
				return
			}
			if bodySize > maxQuotaAnswerBytes {
				proxywasm.LogDebug("sluice: quota answer of " + strconv.Itoa(bodySize) + " bytes is over the limit")
				onAnswer(status, nil)
				return
			}
			b, err := proxywasm.GetHttpCallResponseBody(0, bodySize)
			if err != nil {
				proxywasm.LogDebug("sluice: reading the quota answer: " + err.Error())
				b = nil
			} else if b == nil {
				b = []byte{}
			}
			onAnswer(status, b)
		})
	return err
}

// fleetPolicy is the policy in use as the quota client sees it (nil: none).
func (p *pluginContext) fleetPolicy() *fleetclient.Policy {
	ps := p.pol
	if ps == nil {
		return nil
	}
	if ps.fleetPol == nil {
		ps.fleetPol = &fleetclient.Policy{Name: ps.compiled.Name, Version: ps.version, Env: ps.compiled.Env(),
			Rule: func(id string) (fleetclient.Rule, bool) {
				for i := range ps.rules {
					rs := &ps.rules[i]
					if rs.cr.ID == id && rs.fleet.mode != fleetNone {
						alg := rs.cr.Config.Algorithm
						return fleetclient.Rule{LeaseKeys: rs.fleet.leaseKeys, Fingerprint: rs.cr.Fingerprint, StatusKey: rs.fleet.statusKey,
							Windowed: alg == limit.FixedWindow || alg == limit.TimeWheel}, true
					}
				}
				return fleetclient.Rule{}, false
			}}
	}
	return ps.fleetPol
}

// fleetRuleByID returns the fleet rule of that id in the policy in use.
func (p *pluginContext) fleetRuleByID(id string) *ruleState {
	if p.pol == nil {
		return nil
	}
	for i := range p.pol.rules {
		rs := &p.pol.rules[i]
		if rs.cr.ID == id {
			if rs.fleet.mode == fleetNone {
				return nil
			}
			return rs
		}
	}
	return nil
}

// resumeWaiters re-decides every request waiting on k, each with its stream
// as the effective context: it continues, is answered, or waits again. A
// request whose stream ended meanwhile is skipped.
func (p *pluginContext) resumeWaiters(k *fleetclient.Key) {
	waiters := k.Waiters
	k.Waiters = nil
	for _, w := range waiters {
		h, _ := w.Stream.(*httpContext)
		if h == nil || h.fq.seq != w.Seq || w.Seq == 0 {
			continue
		}
		if err := proxywasm.SetEffectiveContext(h.fq.id); err != nil {
			h.fq.seq = 0
			continue
		}
		h.fq.seq = 0
		if h.OnHttpRequestHeaders(0, false) == types.ActionContinue {
			if err := proxywasm.ResumeHttpRequest(); err != nil {
				proxywasm.LogDebug("sluice: resuming a request: " + err.Error())
			}
		}
	}
}
