package host_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/host"
)

// handlerTransport answers calls with an http.Handler, in process.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// DoBatch answers as Do would, request by request in order: before(i) runs
// first (here it moves the clock), a request the plugin pauses for a call is
// finished after its visit, and one with an Upstream func goes through Do.
// With InlineCallouts the call is answered with no goroutine of its own and
// WaitCallouts has nothing left to wait for.
func TestDoBatchAnswersAsDoWould(t *testing.T) {
	calls := 0
	client := &http.Client{Transport: handlerTransport{http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Write([]byte("answer-" + strconv.Itoa(calls)))
	})}}
	h, clock := newHost(t, host.Config{NoCanary: true, InlineCallouts: true, HTTPClient: client,
		Clusters: map[string]string{"control_plane": "in.process:80"}})
	upstreamSaw := ""
	reqs := []host.Request{
		{Headers: op("time")},
		{Headers: op("callout", "x-cluster", "control_plane")},
		{Headers: op("time")},
		{Headers: op("time"), Upstream: func(u host.UpstreamRequest) host.UpstreamResponse {
			upstreamSaw = u.Headers.Get("x-host-ns")
			return host.UpstreamResponse{Status: 201}
		}},
		{Headers: op("time")},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var befores []int
	resps, err := h.Worker(0).DoBatch(ctx, reqs, func(i int) {
		befores = append(befores, i)
		clock.Advance(time.Second)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.WaitCallouts(ctx); err != nil {
		t.Fatal(err)
	}
	if len(befores) != len(reqs) {
		t.Fatalf("before ran for %v, want every request once", befores)
	}
	ns := func(i int) string { return strconv.FormatInt(epoch.Add(time.Duration(i+1)*time.Second).UnixNano(), 10) }
	for _, i := range []int{0, 2, 4} {
		if resps[i].Status != 200 || resps[i].Upstream.Headers.Get("x-host-ns") != ns(i) {
			t.Errorf("request %d: %d, time %s, want 200 at %s", i, resps[i].Status, resps[i].Upstream.Headers.Get("x-host-ns"), ns(i))
		}
	}
	if got := resps[1].Upstream; got == nil || got.Headers.Get("x-callout") != "200  answer-1 nil 0" {
		t.Errorf("the paused request: %+v", got)
	}
	if resps[3].Status != 201 || upstreamSaw != ns(3) {
		t.Errorf("the request with an upstream: %d, saw time %s, want 201 at %s", resps[3].Status, upstreamSaw, ns(3))
	}
}
