package redisproc

import (
	"strings"
	"testing"
)

func TestServerKillRestart(t *testing.T) {
	s := Start(t)
	if _, err := Command(s.Addr(), "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if _, err := Command(s.Addr(), "PING"); err == nil {
		t.Fatal("PING answered after Kill")
	}
	s.Restart()
	if v, err := Command(s.Addr(), "GET", "k"); err != nil || v != "" {
		t.Fatalf("after restart GET k = %q, %v; want empty (nothing persisted)", v, err)
	}
}

func TestClusterOwnsSlots(t *testing.T) {
	c := StartCluster(t)
	if len(c.Nodes) != 3 {
		t.Fatal(len(c.Nodes))
	}
	info, err := Command(c.Nodes[1].Addr(), "CLUSTER", "INFO")
	if err != nil || !strings.Contains(info, "cluster_known_nodes:3") {
		t.Fatalf("%v\n%s", err, info)
	}
	seen := map[*Server]bool{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		o, err := c.Owner(k)
		if err != nil {
			t.Fatal(err)
		}
		seen[o] = true
		if _, err := Command(o.Addr(), "SET", k, "1"); err != nil {
			t.Fatalf("owner of %s refused SET: %v", k, err)
		}
		for _, n := range c.Nodes {
			if n != o {
				if _, err := Command(n.Addr(), "SET", k, "1"); err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
					t.Fatalf("non-owner %s of %s: %v, want MOVED", n.Addr(), k, err)
				}
			}
		}
	}
	if len(seen) < 2 {
		t.Fatalf("10 keys landed on %d node(s)", len(seen))
	}
}

func TestServerAppendOnlyKeepsWrites(t *testing.T) {
	s := Start(t, Options{AppendOnly: true})
	if _, err := Command(s.Addr(), "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	if v, err := Command(s.Addr(), "GET", "k"); err != nil || v != "v" {
		t.Fatalf("after restart GET k = %q, %v; want v", v, err)
	}
}
