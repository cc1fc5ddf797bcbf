package quota

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/shared/quota"
	"github.com/sluice-proxy/sluice/testenv/testkit/redisproc"
)

type errBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Details []struct {
			Field   string `json:"field"`
			Message string `json:"message"`
		} `json:"details"`
	} `json:"error"`
}

func rawPost(t *testing.T, url, token, body string) (int, errBody, http.Header) {
	t.Helper()
	hr, _ := http.NewRequest(http.MethodPost, url+"/v1/quota", strings.NewReader(body))
	hr.Header.Set("Content-Type", "application/json")
	if token != "" {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var eb errBody
	if res.StatusCode != http.StatusOK {
		if err := json.Unmarshal(b, &eb); err != nil {
			t.Fatalf("status %d: body is not JSON: %s", res.StatusCode, b)
		}
	}
	return res.StatusCode, eb, res.Header
}

const okBody = `{"envoy":"e","policy":"p","version":1,"env":"t","keys":[{"rule":"fw","key":"rl:t:p/fw:*:60s","want":1}]}`

func TestQuotaTokenIsRequired(t *testing.T) {
	clk := &clock{}
	clk.set(base())
	s := New(Options{Backend: NewMemory(), Policies: newPolicies(t), Token: "quota-secret", Now: clk.Now})
	srv := serve(t, s)
	if code, eb, h := rawPost(t, srv.URL, "", okBody); code != http.StatusUnauthorized || eb.Error.Code != "unauthorized" || h.Get("WWW-Authenticate") == "" {
		t.Fatalf("no token: %d %+v", code, eb)
	}
	if code, eb, _ := rawPost(t, srv.URL, "admin-secret", okBody); code != http.StatusForbidden || eb.Error.Code != "forbidden" {
		t.Fatalf("wrong token: %d %+v", code, eb)
	}
	if code, _, _ := rawPost(t, srv.URL, "quota-secret", okBody); code != http.StatusOK {
		t.Fatalf("quota token: %d", code)
	}
	// No quota token configured, authentication on: quota calls are refused.
	closed := serve(t, New(Options{Backend: NewMemory(), Policies: newPolicies(t), Now: clk.Now}))
	if code, _, _ := rawPost(t, closed.URL, "anything", okBody); code != http.StatusForbidden {
		t.Fatalf("no quota token configured: %d", code)
	}
	res, err := http.Get(srv.URL + "/v1/quota")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "POST" {
		t.Fatalf("GET: %d", res.StatusCode)
	}
}

// TestAnswersSayHowManyEnvoysShareTheKeyToClientsThatAsk: a key's answer counts
// the Envoys on it (the asker included) for a client sending the
// sluice-quota-envoys header, and carries no such member for one that does not
// (a filter built before the field would refuse it).
func TestAnswersSayHowManyEnvoysShareTheKeyToClientsThatAsk(t *testing.T) {
	clk := &clock{}
	clk.set(base())
	srv := serve(t, New(Options{Backend: NewMemory(), Policies: newPolicies(t), Open: true, Now: clk.Now}))
	post := func(envoy string, header bool) string {
		body := strings.Replace(okBody, `"envoy":"e"`, `"envoy":"`+envoy+`"`, 1)
		var h []string
		if header {
			h = []string{quota.EnvoysHeader, "1"}
		}
		return postQuota(t, srv.URL, body, h...)
	}
	for i, e := range []string{"e1", "e2", "e3"} {
		if b := post(e, true); !strings.Contains(b, `"envoys":`+strconv.Itoa(i+1)+`}`) {
			t.Fatalf("Envoy %d of %d: %s", i+1, i+1, b)
		}
	}
	if b := post("e1", false); strings.Contains(b, "envoys") {
		t.Fatalf("an answer to a client without the header: %s", b)
	}
	if b := post("e1", true); !strings.Contains(b, `"envoys":3}`) {
		t.Fatalf("the first Envoy asking again: %s", b)
	}
}

// TestAnswersSayWhatTheWindowHasLeftToClientsThatAsk: a fixed window's answer
// to a client sending the sluice-quota-left header carries its share of what
// the window has left beyond every lease (⌊remaining/Envoys⌋) and how long the
// window still runs; a client without the header never gets the members, nor
// does a key of another algorithm.
func TestAnswersSayWhatTheWindowHasLeftToClientsThatAsk(t *testing.T) {
	clk := &clock{}
	clk.set(base() + int64(20*time.Second))
	srv := serve(t, New(Options{Backend: NewMemory(), Policies: newPolicies(t), Open: true, Now: clk.Now}))
	post := func(envoy string, want int, header bool) quota.KeyResult {
		t.Helper()
		body := strings.Replace(okBody, `"envoy":"e"`, `"envoy":"`+envoy+`"`, 1)
		body = strings.Replace(body, `"want":1`, `"want":`+strconv.Itoa(want), 1)
		var h []string
		if header {
			h = []string{quota.LeftHeader, "1"}
		}
		resp, err := quota.DecodeResponse([]byte(postQuota(t, srv.URL, body, h...)))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Keys[0]
	}
	// 1000 a minute: e1 takes 100, e2 then 300 (within its fair share of 500),
	// and 600 are left for the two, 300 each, for the 40 s the window runs.
	if r := post("e1", 100, true); r.Left != 900 || r.LeftFor != 40*time.Second {
		t.Fatalf("e1 alone after 100 granted: %+v, want left 900 (alone) for 40s", r)
	}
	if r := post("e2", 300, true); r.Granted != 300 || r.Left != 300 || r.LeftFor != 40*time.Second {
		t.Fatalf("e2 after 300 granted: %+v, want left 300 (600 for two) for 40s", r)
	}
	if r := post("e2", 1, false); r.Left != 0 || r.LeftFor != 0 {
		t.Fatalf("an answer to a client without the header: %+v", r)
	}
	body := strings.Replace(okBody, `p/fw:`, `p/tw:`, 1)
	body = strings.Replace(body, `"rule":"fw"`, `"rule":"tw"`, 1)
	resp, err := quota.DecodeResponse([]byte(postQuota(t, srv.URL, body, quota.LeftHeader, "1")))
	if err != nil || resp.Keys[0].LeftFor != 0 || resp.Keys[0].Status != quota.StatusGranted {
		t.Fatalf("a time_wheel key: %+v %v, want granted and no left", resp, err)
	}
}

func TestMalformedQuotaBodiesAre400NamingTheField(t *testing.T) {
	clk := &clock{}
	clk.set(base())
	srv := serve(t, New(Options{Backend: NewMemory(), Policies: newPolicies(t), Open: true, Now: clk.Now}))
	for _, c := range []struct{ body, field string }{
		{`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"fw","key":"k","want":"many"}]}`, "keys[0].want"},
		{`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"fw","key":"k","extra":1}]}`, "keys[0].extra"},
		{`{"envoy":"e","policy":"p","keys":[{"rule":"fw","key":"k"}]}`, "version"},
		{`{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"fw","key":"k"}`, "keys[0]"},
		{`[]`, ""},
	} {
		code, eb, _ := rawPost(t, srv.URL, "", c.body)
		if code != http.StatusBadRequest || eb.Error.Code != "invalid_document" || len(eb.Error.Details) == 0 || eb.Error.Details[0].Field != c.field {
			t.Errorf("%s: %d %+v, want 400 naming %q", c.body, code, eb, c.field)
		}
	}
}

func TestOversizedQuotaBatchIs413(t *testing.T) {
	clk := &clock{}
	clk.set(base())
	srv := serve(t, New(Options{Backend: NewMemory(), Policies: newPolicies(t), Open: true, Now: clk.Now,
		Limits: quota.Limits{MaxKeys: 10, MaxBytes: 4096}}))
	keys := func(n int) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"rule":"keyed","key":"rl:t:p/keyed:ip=10.0.0.` + strconv.Itoa(i) + `:60s","want":1}`)
		}
		return `{"envoy":"e","policy":"p","version":1,"env":"t","keys":[` + b.String() + `]}`
	}
	if code, _, _ := rawPost(t, srv.URL, "", keys(10)); code != http.StatusOK {
		t.Fatalf("10 keys: %d", code)
	}
	if code, eb, _ := rawPost(t, srv.URL, "", keys(11)); code != http.StatusRequestEntityTooLarge || eb.Error.Details[0].Field != "keys" {
		t.Fatalf("11 keys: %d %+v", code, eb)
	}
	big := `{"envoy":"e","policy":"p","version":1,"keys":[{"rule":"fw","key":"` + strings.Repeat("x", 5000) + `"}]}`
	if code, eb, _ := rawPost(t, srv.URL, "", big); code != http.StatusRequestEntityTooLarge || eb.Error.Code != "too_large" {
		t.Fatalf("5000 bytes: %d %+v", code, eb)
	}
}

// TestRedisDownAnswers503AndNothingIsOverGranted kills Redis mid-run: quota calls
// answer 503 with a JSON error (and grant nothing); after a restart (Redis with an
// fsync'd append-only file, so it kept every acknowledged write) the window still
// grants exactly its limit in total.
func TestRedisDownAnswers503AndNothingIsOverGranted(t *testing.T) {
	rs := redisproc.Start(t, redisproc.Options{AppendOnly: true})
	client := redisClient(rs.Addr())
	defer client.Close()
	clk := &clock{}
	start := base() + 11*int64(time.Hour)
	clk.set(start + int64(time.Second))
	reg := prometheus.NewRegistry()
	s := New(Options{Backend: NewRedis(client), Policies: newPolicies(t), Open: true, Now: clk.Now,
		Timeout: 300 * time.Millisecond, Registry: reg})
	srv := serve(t, s)
	req := &quota.Request{Envoy: "e1", Policy: "p", Version: 1, Env: testEnv, Keys: []quota.KeyRequest{{Rule: "fw", Key: globalKey("fw"), Want: 300}}}
	var total uint64
	resp, code, body := post(t, srv.URL, "", req)
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	total += resp.Keys[0].Granted

	rs.Kill()
	for i := 0; i < 3; i++ {
		_, code, body := post(t, srv.URL, "", req)
		var eb errBody
		_ = json.Unmarshal(body, &eb)
		if code != http.StatusServiceUnavailable || eb.Error.Code != "store_unavailable" {
			t.Fatalf("Redis down: %d %s", code, body)
		}
	}
	if n := counterValue(t, reg, "sluice_controlplane_quota_keys_total", quota.StatusGranted); n != 1 {
		t.Fatalf("keys granted counter %v, want 1 (nothing counted while down)", n)
	}
	rs.Restart()
	for i := 0; i < 50; i++ {
		req.Envoy = "e" + strconv.Itoa(i%3)
		resp, code, body := post(t, srv.URL, "", req)
		if code != http.StatusOK {
			// The client may need a round to reconnect.
			if code == http.StatusServiceUnavailable {
				continue
			}
			t.Fatalf("%d %s", code, body)
		}
		total += resp.Keys[0].Granted
	}
	if total != 1000 {
		t.Fatalf("granted %d across the outage, want exactly 1000", total)
	}
	var buf bytes.Buffer
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		buf.WriteString(mf.GetName() + "\n")
	}
	for _, name := range []string{"sluice_controlplane_quota_units_granted_total", "sluice_controlplane_quota_request_duration_seconds", "sluice_controlplane_quota_keys_active"} {
		if !strings.Contains(buf.String(), name) {
			t.Errorf("metric %s not registered:\n%s", name, buf.String())
		}
	}
}

// counterValue reads a counter of reg, the one with label value lv if given.
func counterValue(t *testing.T, reg *prometheus.Registry, name, lv string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if lv == "" || (len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() == lv) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestRedisKilledUnderLoadNeverOverGrants kills Redis while four Envoys are asking:
// every answer is 200 or a 503 JSON error, and across the outage the 200 answers
// never grant more than the limit (a grant the store recorded but whose answer was
// lost is under-admission, never over).
func TestRedisKilledUnderLoadNeverOverGrants(t *testing.T) {
	rs := redisproc.Start(t, redisproc.Options{AppendOnly: true})
	client := redisClient(rs.Addr())
	defer client.Close()
	clk := &clock{}
	clk.set(base() + 13*int64(time.Hour) + int64(time.Second))
	srv := serve(t, New(Options{Backend: NewRedis(client), Policies: newPolicies(t), Open: true, Now: clk.Now, Timeout: 300 * time.Millisecond}))
	var mu sync.Mutex
	var total uint64
	var ok, unavailable int
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			req := &quota.Request{Envoy: "e" + strconv.Itoa(i), Policy: "p", Version: 1, Env: testEnv,
				Keys: []quota.KeyRequest{{Rule: "fw", Key: globalKey("fw"), Want: 7}}}
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, code, body := post(t, srv.URL, "", req)
				mu.Lock()
				switch code {
				case http.StatusOK:
					ok++
					total += resp.Keys[0].Granted
				case http.StatusServiceUnavailable:
					unavailable++
					time.Sleep(time.Millisecond)
				default:
					t.Errorf("status %d: %s", code, body)
				}
				mu.Unlock()
			}
		}(i)
	}
	deadline := time.Now().Add(2 * time.Minute) // a hang guard, not a speed check
	waitFor := func(cond func() bool) {
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatal("the run did not progress")
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor(func() bool { mu.Lock(); defer mu.Unlock(); return ok >= 20 })
	rs.Kill()
	waitFor(func() bool { mu.Lock(); defer mu.Unlock(); return unavailable >= 8 })
	rs.Restart()
	okAfter := 0
	mu.Lock()
	okAfter = ok
	mu.Unlock()
	waitFor(func() bool { mu.Lock(); defer mu.Unlock(); return ok >= okAfter+200 })
	close(stop)
	wg.Wait()
	if total > 1000 {
		t.Fatalf("granted %d across the outage, limit 1000", total)
	}
	if total < 140 {
		t.Fatalf("granted only %d", total)
	}
	t.Logf("granted %d (limit 1000) in %d answers, %d answered 503", total, ok, unavailable)
}

// TestQuotaBodyMustBeJSON: a body declared as anything but application/json is
// 415 unsupported_media_type, with the quota token and a valid document; a
// charset parameter is fine.
func TestQuotaBodyMustBeJSON(t *testing.T) {
	clk := &clock{}
	clk.set(base())
	srv := serve(t, New(Options{Backend: NewMemory(), Policies: newPolicies(t), Token: "quota-secret", Now: clk.Now}))
	for ct, want := range map[string]int{"": 415, "text/plain": 415, "application/merge-patch+json": 415, "application/json; charset=utf-8": 200} {
		hr, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/quota", strings.NewReader(okBody))
		hr.Header.Set("Authorization", "Bearer quota-secret")
		if ct != "" {
			hr.Header.Set("Content-Type", ct)
		}
		res, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != want || (want == 415 && !strings.Contains(string(b), "unsupported_media_type")) {
			t.Errorf("Content-Type %q: %d %s, want %d", ct, res.StatusCode, b, want)
		}
	}
}

// TestAChargeIsBookedOnce: a filter's charge (units it admitted without a
// lease) is taken from the key's budget, once; the answer says the service
// books charges only to a client that sent the sluice-quota-charge header.
func TestAChargeIsBookedOnce(t *testing.T) {
	clk := &clock{}
	clk.set(base())
	s := New(Options{Backend: NewMemory(), Policies: newPolicies(t), Open: true, Now: clk.Now})
	key := globalKey("fw")
	es := []*envoy{{id: 0, name: "e0"}, {id: 1, name: "e1"}, {id: 2, name: "e2"}}
	for _, e := range es {
		ask(t, s, e, "fw", key, 0, 0, 1)
	}
	// e0 admitted 300 by itself while cut off; it reports them with the one
	// unit it spent from its lease.
	resp, err := s.Handle(context.Background(), &quota.Request{Envoy: "e0", Policy: "p", Version: 1, Env: testEnv, Interval: time.Second,
		Keys: []quota.KeyRequest{{Rule: "fw", Key: key, Used: 1, Charge: 300}}})
	if err != nil || resp.Keys[0].Status != quota.StatusGranted {
		t.Fatalf("the charge: %+v, %v", resp, err)
	}
	// Everyone asks until refused: what is left is 1000 - 3 - 300.
	var got [3]uint64
	for round := 0; round < 100; round++ {
		for i, e := range es {
			if r := ask(t, s, e, "fw", key, e.held, 0, 50); r.Status != quota.StatusRefused {
				got[i] += r.Granted
			}
		}
	}
	if sum := got[0] + got[1] + got[2]; sum != 1000-3-300 {
		t.Fatalf("granted %v after a charge of 300, %d in all, want %d", got, sum, 1000-3-300)
	}

	srv := serve(t, s)
	for _, header := range []bool{true, false} {
		var h []string
		if header {
			h = []string{quota.ChargeHeader, "1"}
		}
		b := postQuota(t, srv.URL, okBody, h...)
		if says := strings.Contains(string(b), `"charges":true`); says != header {
			t.Errorf("with the header %v the answer says charges %v: %s", header, says, b)
		}
	}
}

// postQuota posts body to the quota endpoint of the server at url with the
// headers given as name, value pairs, and returns the answer's body.
func postQuota(t *testing.T, url, body string, kv ...string) string {
	t.Helper()
	hr, _ := http.NewRequest(http.MethodPost, url+"/v1/quota", strings.NewReader(body))
	hr.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(kv); i += 2 {
		hr.Header.Set(kv[i], kv[i+1])
	}
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}
