package policysync

import (
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// propHost is a fakeHost that also answers proxy_get_property.
type propHost struct {
	*fakeHost
	props map[string]string // path joined by "."
	reads int
}

func (h *propHost) GetProperty(path []string) ([]byte, error) {
	h.reads++
	v, ok := h.props[strings.Join(path, ".")]
	if !ok {
		return nil, proxywasm.ErrNotFound
	}
	return []byte(v), nil
}

func identifyingSyncer(t *testing.T, props map[string]string) (*propHost, *Syncer, *clock) {
	t.Helper()
	h := &propHost{fakeHost: newFakeHost(t, newStore()), props: props}
	clk := &clock{t: epoch}
	s, err := New(Options{Policy: "default", Cluster: "control_plane", Host: h, Now: clk.now, VMToken: 1,
		Apply: func(*rules.Compiled) error { return nil }, Int64N: func(int64) int64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	clk.advance(DefaultTick)
	s.Tick()
	return h, s, clk
}

// TestPollNamesItsEnvoy: the long poll carries the Envoy's node id (read
// once, xds.node.id first), the filter build, and once a version is applied
// its entity tag.
func TestPollNamesItsEnvoy(t *testing.T) {
	h, _, _ := identifyingSyncer(t, map[string]string{"xds.node.id": "envoy-7\n", "node.id": "old"})
	c := h.lastCall()
	if c.header("x-sluice-node") != "envoy-7" || c.header("x-sluice-build") != Build || c.header("x-sluice-version") != "" {
		t.Fatalf("first poll headers %v", c.headers)
	}
	h.respond(c, "200", [][2]string{{"etag", `"v1.e.s"`}}, policyDoc(1, 10))
	c2 := h.lastCall()
	if c2 == c || c2.header("x-sluice-version") != `"v1.e.s"` || c2.header("x-sluice-node") != "envoy-7" {
		t.Fatalf("second poll headers %v", c2.headers)
	}
	if h.reads != 1 {
		t.Fatalf("node id read %d times, want once", h.reads)
	}
}

func TestPollFallsBackToTopLevelNode(t *testing.T) {
	h, _, _ := identifyingSyncer(t, map[string]string{"node.id": "legacy"})
	if got := h.lastCall().header("x-sluice-node"); got != "legacy" {
		t.Fatalf("x-sluice-node %q", got)
	}
}

func TestPollWithoutNodeIDSendsNoIdentity(t *testing.T) {
	h, _, _ := identifyingSyncer(t, nil)
	c := h.lastCall()
	if c.header("x-sluice-node") != "" || c.header("x-sluice-build") != "" {
		t.Fatalf("headers %v", c.headers)
	}
}
