package app

import (
	"bytes"
	"encoding/json"
	"testing"
)

const fleetDoc = `{"policy":"p","rules":[{"id":"fw","algorithm":"fixed_window","limit":5,"window":"1h","scope":"fleet"}]}`

// TestQuotaEndpointServedWithEmbeddedStore: the binary routes POST /v1/quota to
// the quota service (state in memory with the embedded store), behind its own
// token, and exports its metrics; answers match openapi.yaml.
func TestQuotaEndpointServedWithEmbeddedStore(t *testing.T) {
	env := map[string]string{"SLUICE_ADMIN_TOKEN": "adm", "SLUICE_QUOTA_TOKEN": "qt", "SLUICE_DATA_DIR": t.TempDir()}
	c, _ := server(t, nil, env)
	if r := c.Do("PUT", "/v1/policies/p", []byte(fleetDoc)); r.Status != 201 {
		t.Fatalf("PUT → %d %s", r.Status, r.Body)
	}
	body := []byte(`{"envoy":"e1","policy":"p","version":1,"keys":[{"rule":"fw","key":"rl:default:p/fw:*:3600s","want":10}]}`)
	if r := c.Do("POST", "/v1/quota", body); r.Status != 403 {
		t.Fatalf("admin token on quota → %d %s", r.Status, r.Body)
	}
	if r := c.Do("POST", "/v1/quota", body, "Authorization", ""); r.Status != 401 {
		t.Fatalf("no token → %d %s", r.Status, r.Body)
	}
	var total uint64
	for i := 0; i < 6; i++ {
		r := c.Do("POST", "/v1/quota", body, "Authorization", "Bearer qt")
		if r.Status != 200 {
			t.Fatalf("quota → %d %s", r.Status, r.Body)
		}
		var resp struct {
			Keys []struct {
				Status  string `json:"status"`
				Granted uint64 `json:"granted"`
			} `json:"keys"`
		}
		if err := json.Unmarshal(r.Body, &resp); err != nil {
			t.Fatal(err)
		}
		total += resp.Keys[0].Granted
	}
	if total != 5 {
		t.Fatalf("granted %d in one window, limit 5", total)
	}
	if r := c.Do("POST", "/v1/quota", []byte(`{"envoy":"e1"}`), "Authorization", "Bearer qt"); r.Status != 400 {
		t.Fatalf("malformed → %d %s", r.Status, r.Body)
	}
	if m := c.Do("GET", "/metrics", nil); !bytes.Contains(m.Body, []byte("sluice_controlplane_quota_units_granted_total 5")) {
		t.Fatalf("metrics:\n%s", m.Body)
	}
}

// TestOpenModeQuotaChecksHost: without tokens the quota route is guarded like the
// API's own routes, so a DNS-rebinding page cannot spend quota through a
// loopback control plane.
func TestOpenModeQuotaChecksHost(t *testing.T) {
	c, _ := server(t, nil, map[string]string{"SLUICE_DATA_DIR": t.TempDir()})
	if r := c.Do("PUT", "/v1/policies/p", []byte(fleetDoc)); r.Status != 201 {
		t.Fatalf("PUT → %d %s", r.Status, r.Body)
	}
	body := []byte(`{"envoy":"e1","policy":"p","version":1,"keys":[{"rule":"fw","key":"rl:default:p/fw:*:3600s","want":1}]}`)
	if r := c.Do("POST", "/v1/quota", body, "Host", "attacker.example"); r.Status != 403 || !bytes.Contains(r.Body, []byte("forbidden_host")) {
		t.Fatalf("foreign Host → %d %s", r.Status, r.Body)
	}
	if r := c.Do("POST", "/v1/quota", body, "Origin", "http://attacker.example"); r.Status != 403 || !bytes.Contains(r.Body, []byte("forbidden_origin")) {
		t.Fatalf("foreign Origin → %d %s", r.Status, r.Body)
	}
	if r := c.Do("POST", "/v1/quota", body); r.Status != 200 {
		t.Fatalf("loopback → %d %s", r.Status, r.Body)
	}
}
