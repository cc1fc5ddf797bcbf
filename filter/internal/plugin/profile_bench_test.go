//go:build !wasip1

package plugin

import (
	"strconv"
	"testing"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// BenchmarkStreamMix runs the filter natively over the binding's emulator on
// a mix of whole streams, in turn: two allowed one-rule requests of 1,000
// users, a denied request (a 429 of one flooding user, with the x-request-id
// Envoy sets) and a request five rules count. Its CPU profile is the
// profile the compiler builds the filter with (filter/default.pgo, Go's
// profile-guided optimization, go.dev/doc/pgo): the same source compiles to
// the .wasm, so the calls that are hot here are hot there. Regenerate it
// with make pgo after a change to the request path (docs/benchmarks.md,
// "Profile-guided build").
func BenchmarkStreamMix(b *testing.B) {
	e, err := proxywasm.NewEmulator(NewVMContext(), proxywasm.EmulatorOptions{
		PluginConfig: []byte(`{"tick":"1m","policy":` + allocPolicy + `}`),
		Properties:   map[string]string{"source.address": "203.0.113.7:443", "xds.node.id": "mix-node", "plugin_name": "sluice"},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.Close)
	users := make([]string, 1000)
	for i := range users {
		users[i] = "user-" + strconv.Itoa(i)
	}
	const requestID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
	kinds := []struct {
		path, user string // user "" means the next of users
		status     uint32
	}{
		{"/api/x", "", 0},
		{"/api/x", "", 0},
		{"/tight/x", "flood", 429},
		{"/five/x", "", 0},
	}
	resp := [][2]string{{":status", "200"}}
	headers := make([][2]string, 4)
	stream := func(i int) uint32 {
		k := kinds[i%len(kinds)]
		user := k.user
		if user == "" {
			user = users[i%len(users)]
		}
		headers[0] = [2]string{":method", "GET"}
		headers[1] = [2]string{":path", k.path}
		headers[2] = [2]string{"x-user-id", user}
		headers[3] = [2]string{"x-request-id", requestID}
		id := e.NewStream()
		if e.RequestHeaders(id, headers, true) == types.ActionContinue {
			e.ResponseHeaders(id, resp, true)
		}
		status, _, _, _ := e.LocalReply(id)
		e.StreamDone(id)
		return status
	}
	for i := range 2 * len(users) { // warm: buckets, scratch, the flood's first request
		stream(i)
	}
	b.ResetTimer()
	for i := range b.N {
		if got, want := stream(i), kinds[i%len(kinds)].status; got != want {
			b.Fatalf("stream %d: local reply %d, want %d", i, got, want)
		}
	}
}
