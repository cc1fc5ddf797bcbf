package policysync

import (
	"strconv"
	"testing"
)

// tagOf is a control-plane ETag: version, store epoch and content hash.
func tagOf(version int, epoch, hash string) [][2]string {
	return [][2]string{{"etag", `"v` + strconv.Itoa(version) + "." + epoch + "." + hash + `"`}}
}

// nextPoll ticks until holder w has dispatched its next poll.
func (e *env) nextPoll(w *worker) {
	e.t.Helper()
	n := len(w.h.calls)
	for range 100 {
		if len(w.h.calls) > n {
			return
		}
		e.tick()
	}
	e.t.Fatal("no poll within 100 ticks")
}

// limit returns the limit of the policy worker w applied last.
func (w *worker) limit(t *testing.T) uint64 {
	t.Helper()
	if len(w.applied) == 0 {
		t.Fatal("no policy applied")
	}
	return w.applied[len(w.applied)-1].Policy.Rules[0].Limit
}

// TestNewStoreEpochFollowedAtLowerVersion: after the control plane's store
// lost acknowledged writes, its versions start again lower under a new
// epoch. The filter publishes them (every worker applies them), while a
// lower version of the same epoch (a control-plane replica that is behind)
// is still refused.
func TestNewStoreEpochFollowedAtLowerVersion(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.tick()
	h := e.holder()
	h.h.respond(h.h.lastCall(), "200", tagOf(3, "aaaa", "h3"), policyDoc(3, 30))
	// A replica that is behind: same epoch, lower version.
	h.h.respond(h.h.lastCall(), "200", tagOf(2, "aaaa", "h2"), policyDoc(2, 20))
	e.nextPoll(h)
	for i, w := range e.ws {
		if w.version() != 3 || w.limit(t) != 30 {
			t.Fatalf("worker %d: version %d after a lagging replica's version 2, want 3", i, w.version())
		}
	}
	// The store lost v1..v3 and wrote v1 again: a new epoch.
	h.h.respond(h.h.lastCall(), "200", tagOf(1, "bbbb", "h1"), policyDoc(1, 40))
	e.tick()
	for i, w := range e.ws {
		if w.version() != 1 || w.limit(t) != 40 {
			t.Errorf("worker %d: version %d limit %d after the store's new epoch, want version 1 limit 40", i, w.version(), w.limit(t))
		}
	}
	if got := h.h.lastCall().header("if-none-match"); got != `"v1.bbbb.h1"` {
		t.Errorf("next poll's If-None-Match %s, want the new epoch's ETag", got)
	}
	m, _ := DecodeMeta(must(e.st.get(MetaKey("default"))))
	if m.Version != 1 || m.ETag != `"v1.bbbb.h1"` {
		t.Errorf("published meta %+v, want version 1 of the new epoch", m)
	}
}

// TestSameVersionOtherContentFollowed: a document with the published
// version and epoch but another content hash (a write lost without any
// control plane noticing, then a new write of the same number) replaces
// the published one.
func TestSameVersionOtherContentFollowed(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.tick()
	w := e.ws[0]
	w.h.respond(w.h.lastCall(), "200", tagOf(3, "aaaa", "h3"), policyDoc(3, 30))
	w.h.respond(w.h.lastCall(), "200", tagOf(3, "aaaa", "other"), policyDoc(3, 60))
	if w.version() != 3 || w.limit(t) != 60 {
		t.Errorf("version %d limit %d, want version 3 with the new content (limit 60)", w.version(), w.limit(t))
	}
}

// TestETagEpoch: the epoch is the middle of "v<version>.<epoch>.<hash>";
// other tags (older control planes' "v7", anything else) have none.
func TestETagEpoch(t *testing.T) {
	for tag, want := range map[string]string{
		`"v7.abc.def"`:   "abc",
		`W/"v7.abc.def"`: "abc",
		`"v7..def"`:      "",
		`"v7"`:           "",
		`"v7.abc"`:       "",
		`v7.abc.def`:     "",
		``:               "",
		`"x7.abc.def"`:   "",
	} {
		if got := ETagEpoch(tag); got != want {
			t.Errorf("ETagEpoch(%s) = %q, want %q", tag, got, want)
		}
	}
}

func must(b []byte, _ uint32, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestSupersedes(t *testing.T) {
	for _, tc := range []struct {
		v       uint64
		tag     string
		pv      uint64
		ptag    string
		replace bool
	}{
		{4, `"v4.a.x"`, 3, `"v3.a.y"`, true},  // newer, same epoch
		{2, `"v2.a.x"`, 3, `"v3.a.y"`, false}, // a replica behind
		{3, `"v3.a.y"`, 3, `"v3.a.y"`, false}, // the same document
		{3, `"v3.a.z"`, 3, `"v3.a.y"`, true},  // same number, other content
		{1, `"v1.b.x"`, 3, `"v3.a.y"`, true},  // new epoch, lower version
		{1, `"v1.b.x"`, 3, `"v3"`, true},      // from a control plane before epochs
		{2, `"v2"`, 3, `"v3"`, false},         // both before epochs: versions only
		{3, `"v3"`, 3, `"v3"`, false},         //
		{4, `"v4..x"`, 3, `"v3..y"`, true},    // empty epochs compare equal
		{3, `"v3..x"`, 3, `"v3..y"`, false},   // no epoch, no content rule
	} {
		if got := Supersedes(tc.v, tc.tag, tc.pv, tc.ptag); got != tc.replace {
			t.Errorf("Supersedes(%d %s over %d %s) = %v, want %v", tc.v, tc.tag, tc.pv, tc.ptag, got, tc.replace)
		}
	}
}
