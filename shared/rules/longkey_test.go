package rules

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
)

// TestLongKeyValuesAreCarriedAsDigests: a value longer than MaxKeyValueBytes once
// escaped is carried as "%S" and its SHA-256, so a key never outgrows MaxKeyBytes;
// one at the bound is carried as it is.
func TestLongKeyValuesAreCarriedAsDigests(t *testing.T) {
	c := mustCompile(t, keyPolicy, "prod")
	i := ruleIndex(t, c, "keys")
	digestOf := func(v string) string {
		sum := sha256.Sum256([]byte(v))
		return "%S" + base64.RawURLEncoding.EncodeToString(sum[:])
	}
	for _, tc := range []struct {
		name, value, want string
	}{
		{"at the bound", strings.Repeat("a", MaxKeyValueBytes), strings.Repeat("a", MaxKeyValueBytes)},
		{"one over", strings.Repeat("a", MaxKeyValueBytes+1), digestOf(strings.Repeat("a", MaxKeyValueBytes+1))},
		{"escaped at the bound", strings.Repeat("|", MaxKeyValueBytes/3), strings.Repeat("%7C", MaxKeyValueBytes/3)},
		{"escaped one over", strings.Repeat("|", MaxKeyValueBytes/3) + "aaa", digestOf(strings.Repeat("|", MaxKeyValueBytes/3) + "aaa")},
		{"2 KB", strings.Repeat("u", 2<<10), digestOf(strings.Repeat("u", 2<<10))},
		{"60 KB", strings.Repeat("\xff", 60<<10), digestOf(strings.Repeat("\xff", 60<<10))},
		{"looks like a digest", "%S" + strings.Repeat("A", 43), "%25S" + strings.Repeat("A", 43)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := Request{Headers: hdrs("x-tenant-id", "t", "x-api-key", tc.value)}
			k, ok := c.AppendKey(nil, i, &req)
			want := "rl:prod:default/keys:tenant=t|h.x-api-key=" + tc.want + ":3600s"
			if !ok || string(k) != want {
				t.Fatalf("key %.200q, %v\nwant %.200q", k, ok, want)
			}
			if len(k) > MaxKeyBytes {
				t.Fatalf("key of %d bytes", len(k))
			}
		})
	}
	// Long values that differ anywhere give different keys.
	a, _ := c.AppendKey(nil, i, &Request{Headers: hdrs("x-tenant-id", "t", "x-api-key", strings.Repeat("v", 5000)+"1")})
	b, _ := c.AppendKey(nil, i, &Request{Headers: hdrs("x-tenant-id", "t", "x-api-key", strings.Repeat("v", 5000)+"2")})
	if string(a) == string(b) {
		t.Fatalf("two long values share key %q", a)
	}
}

// TestCompileRefusesARuleWhoseKeyCouldOutgrowMaxKeyBytes: eight header parts with
// 128-byte names could build a key over 2,048 bytes; the rule is refused with its
// field named, and four such parts are fine.
func TestCompileRefusesARuleWhoseKeyCouldOutgrowMaxKeyBytes(t *testing.T) {
	policy := func(parts int) string {
		var keys []string
		for n := 0; n < parts; n++ {
			keys = append(keys, strconv.Quote("header:"+strings.Repeat("h", MaxHeaderNameBytes-1)+strconv.Itoa(n)))
		}
		return `{"policy":"p","rules":[{"id":"r","key":[` + strings.Join(keys, ",") + `],"algorithm":"gcra","limit":1,"window":"1s"}]}`
	}
	p, err := ParsePolicy([]byte(policy(8)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Compile(p, CompileOptions{})
	if err == nil || !strings.Contains(err.Error(), "rules[0]") || !strings.Contains(err.Error(), "over the 2048") {
		t.Fatalf("8 long header parts: %v", err)
	}
	mustCompile(t, policy(4), "")
}

func BenchmarkAppendKeyLongValue(b *testing.B) {
	c := mustCompile(b, keyPolicy, "prod")
	i := ruleIndex(b, c, "keys")
	req := Request{Headers: hdrs("x-tenant-id", "t", "x-api-key", strings.Repeat("k", 2<<10))}
	buf := make([]byte, 0, 256)
	for b.Loop() {
		buf, _ = c.AppendKey(buf[:0], i, &req)
	}
}
