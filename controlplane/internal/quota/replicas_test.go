package quota

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

// post sends a quota request over real HTTP and decodes the answer.
func post(t testing.TB, url, token string, req *quota.Request) (*quota.Response, int, []byte) {
	t.Helper()
	hr, _ := http.NewRequest(http.MethodPost, url+"/v1/quota", bytes.NewReader(quota.AppendRequest(nil, req)))
	hr.Header.Set("Content-Type", "application/json")
	if token != "" {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return nil, res.StatusCode, body
	}
	resp, err := quota.DecodeResponse(body)
	if err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return resp, res.StatusCode, body
}

func serve(t testing.TB, s *Service) *httptest.Server {
	mux := http.NewServeMux()
	mux.Handle("/v1/quota", s)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// twoReplicas: two control-plane replicas over real HTTP on one store grant from
// one budget: four Envoys, each alternating replicas, get exactly the limit.
func twoReplicas(t *testing.T, b1, b2 Backend) {
	clk := &clock{}
	clk.set(base() + 9*int64(time.Hour) + int64(time.Second))
	p := newPolicies(t)
	srvs := []*httptest.Server{serve(t, newService(t, b1, p, clk)), serve(t, newService(t, b2, p, clk))}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total uint64
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for n, refused := 0, 0; refused < 4; n++ {
				resp, code, body := post(t, srvs[(i+n)%2].URL, "", &quota.Request{Envoy: "envoy-" + string(rune('a'+i)), Policy: "p", Version: 1,
					Env: testEnv, Keys: []quota.KeyRequest{{Rule: "fw", Key: globalKey("fw"), Want: 61}}})
				if code != http.StatusOK {
					t.Errorf("status %d: %s", code, body)
					return
				}
				g := resp.Keys[0].Granted
				if g == 0 {
					refused++
				}
				mu.Lock()
				total += g
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	if total != 1000 {
		t.Fatalf("two replicas granted %d units in one window, want exactly 1000", total)
	}
}

// slotOwner: a key's state is stored on the Cluster node that owns its slot.
func slotOwner(t *testing.T, b Backend, client redis.UniversalClient, cl *redisproc.Cluster) {
	clk := &clock{}
	clk.set(base() + 10*int64(time.Hour))
	p := newPolicies(t)
	s := newService(t, b, p, clk)
	req := &quota.Request{Envoy: "e", Policy: "p", Version: 1, Env: testEnv, Interval: time.Second}
	for i := 0; i < 30; i++ {
		req.Keys = append(req.Keys, quota.KeyRequest{Rule: "keyed", Key: "rl:t:p/keyed:ip=10.0.0." + string(rune('0'+i%10)) + string(rune('a'+i/10)) + ":60s", Want: 3})
	}
	resp, err := s.Handle(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := s.compile(mustRecord(t, p), testEnv)
	fp := c.c.Rule(c.byID["keyed"]).Fingerprint
	owners := map[string]bool{}
	for i, k := range req.Keys {
		if resp.Keys[i].Granted != 3 {
			t.Fatalf("key %s: %+v", k.Key, resp.Keys[i])
		}
		skey := StorageKey(fp, k.Key)
		o, err := cl.Owner(skey)
		if err != nil {
			t.Fatal(err)
		}
		owners[o.Addr()] = true
		if v, err := redisproc.Command(o.Addr(), "EXISTS", skey); err != nil || v != "1" {
			t.Fatalf("EXISTS %s on its slot owner %s: %q %v", skey, o.Addr(), v, err)
		}
		for _, n := range cl.Nodes {
			if n != o {
				if _, err := redisproc.Command(n.Addr(), "EXISTS", skey); err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
					t.Fatalf("non-owner %s answered EXISTS %s: %v", n.Addr(), skey, err)
				}
			}
		}
	}
	if len(owners) != 3 {
		t.Fatalf("30 keys landed on %d nodes, want 3", len(owners))
	}
	_ = client
}

func mustRecord(t testing.TB, p *policies) store.Record {
	r, ok := p.Get("p")
	if !ok {
		t.Fatal("no policy p")
	}
	return r
}
