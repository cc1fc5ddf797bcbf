package proctest

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// PutPolicy stores doc (a policy document, JSON) as policy name on the
// control plane at addr ("host:port") with PUT /v1/policies/{name} and the
// admin token, and returns the version the control plane assigned, read from
// the ETag ("v<version>.<epoch>.<sum>"). Any status but 200 or 201 fails the
// test, quoting the body.
func PutPolicy(t testing.TB, addr, name, adminToken, doc string) uint64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, "http://"+addr+"/v1/policies/"+name, strings.NewReader(doc))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT policy: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT policy: %s: %s", resp.Status, body)
	}
	num, _, _ := strings.Cut(strings.TrimPrefix(strings.Trim(resp.Header.Get("ETag"), `"`), "v"), ".")
	v, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		t.Fatalf("PUT policy: ETag %q: %v", resp.Header.Get("ETag"), err)
	}
	return v
}

// UnkeyedCounterKey returns the counter key the filter builds, in env, for rule i
// of doc (a policy document) when the rule has no key parts: the one key every
// request of the rule shares. It fails the test if doc does not compile or the
// rule has key parts.
func UnkeyedCounterKey(t testing.TB, doc, env string, i int) string {
	t.Helper()
	p, err := rules.ParsePolicy([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	c, err := rules.Compile(p, rules.CompileOptions{Env: env})
	if err != nil {
		t.Fatal(err)
	}
	k, ok := c.AppendKey(nil, i, &rules.Request{})
	if !ok {
		t.Fatalf("rule %d of the policy has key parts", i)
	}
	return string(k)
}
