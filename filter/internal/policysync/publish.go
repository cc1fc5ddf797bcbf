package policysync

import (
	"errors"
	"strings"

	"github.com/sluice-proxy/sluice/filter/proxywasm"
)

// Publication of a pulled policy in shared data: chunks under a claimed
// generation, committed by one compare-and-swap on the meta.

// publish publishes doc (of version, with etag) unless the published policy
// is not superseded by it (see Supersedes; published then returns the
// published version). It is safe against any number of concurrent
// publishers, whatever the interleaving:
//
//  1. Claim: read the meta and, unless what it holds is not superseded by
//     (version, etag), write it back with Claimed+1 by compare-and-swap. The
//     winner owns generation gen = Claimed+1 alone: no other publisher can
//     claim it, so no other publisher ever writes its chunk keys.
//  2. Write the chunks under generation gen's own keys (ChunkKey). Nothing
//     any reader follows points at them yet.
//  3. Commit: read the meta again and, unless what it now holds is not
//     superseded, write {version, gen, ...} by compare-and-swap on the cas
//     just read. This single write is the commit point: the check and the
//     write see the same meta, so a publication never replaces a policy
//     that supersedes it, and the chunks it points to were complete before
//     it and are never written again by anyone but the publisher that
//     retires them.
//
// After a commit, the chunks of the generation it replaced are shrunk to
// empty (their keys stay; Envoy cannot delete); a publication that lost
// shrinks its own. A lost compare-and-swap is retried up to
// publishAttempts times per step; on failure published is 0.
func (s *Syncer) publish(doc []byte, version uint64, etag string) (published, gen uint64, ok bool) {
	// 1. Claim a generation.
	for attempt := 0; ; attempt++ {
		cur, cas, ok := s.readMeta()
		if !ok || attempt == publishAttempts {
			return 0, 0, false
		}
		if cur.Published() && !Supersedes(version, etag, cur.Version, cur.ETag) {
			return cur.Version, 0, false
		}
		claim := cur
		claim.Claimed = cur.Claimed + 1
		err := s.h.SetSharedData(s.metaKey, AppendMeta(nil, claim), cas)
		if err == nil {
			gen = claim.Claimed
			break
		}
		if !errors.Is(err, proxywasm.ErrCasMismatch) {
			return 0, 0, false
		}
	}
	// 2. Write its chunks: keys nobody else writes.
	chunks := Chunks(doc, gen)
	for i, c := range chunks {
		if err := s.h.SetSharedData(ChunkKey(s.o.Policy, gen, i), c, 0); err != nil {
			s.retireChunks(gen, i)
			return 0, 0, false
		}
	}
	// 3. Commit by one compare-and-swap on the meta.
	m := Meta{
		Version: version, Generation: gen,
		Length: uint32(len(doc)), Chunks: uint32(len(chunks)),
		Checksum: Checksum(doc), ETag: etag,
	}
	for attempt := 0; attempt < publishAttempts; attempt++ {
		cur, cas, ok := s.readMeta()
		if !ok {
			break
		}
		if cur.Published() && !Supersedes(version, etag, cur.Version, cur.ETag) {
			s.retireChunks(gen, len(chunks))
			return cur.Version, 0, false
		}
		m.Claimed = max(cur.Claimed, gen)
		err := s.h.SetSharedData(s.metaKey, AppendMeta(nil, m), cas)
		if err == nil {
			if cur.Published() {
				s.retireChunks(cur.Generation, int(cur.Chunks))
			}
			return version, gen, true
		}
		if !errors.Is(err, proxywasm.ErrCasMismatch) {
			break
		}
	}
	s.retireChunks(gen, len(chunks))
	return 0, 0, false
}

// publishAttempts bounds the compare-and-swap attempts of each step of
// publish: publishers contend only while a lease passes, so two suffice
// in practice.
const publishAttempts = 4

// readMeta reads the meta and its cas, creating the key if it is absent.
// A value that does not decode reads as the zero Meta (so it is
// overwritten by the next claim, still by compare-and-swap); ok is false
// only if shared data failed.
func (s *Syncer) readMeta() (m Meta, cas uint32, ok bool) {
	val, cas, err := s.h.GetSharedData(s.metaKey)
	if errors.Is(err, proxywasm.ErrNotFound) {
		s.createKeys()
		val, cas, err = s.h.GetSharedData(s.metaKey)
	}
	if err != nil {
		return Meta{}, 0, false
	}
	m, _ = DecodeMeta(val)
	return m, cas, true
}

// retireChunks shrinks the first n chunk keys of generation gen to empty
// values, which readers take for a torn read: a reader that was reading
// them reads the newer meta on its next check. Errors are ignored: a chunk
// left as it was only costs its bytes.
func (s *Syncer) retireChunks(gen uint64, n int) {
	for i := range min(n, MaxChunks) {
		key := ChunkKey(s.o.Policy, gen, i)
		if val, _, err := s.h.GetSharedData(key); err == nil && len(val) > 0 {
			_ = s.h.SetSharedData(key, nil, 0)
		}
	}
}

// Supersedes reports whether the control plane's document (version, etag)
// replaces the published one (pubVersion, pubETag). Within one store epoch
// (ETagEpoch; controlplane/openapi.yaml, "Versions and entity tags") only a
// higher version does, so a control-plane replica that is behind cannot
// move the policy back; a document of the same version with another tag
// (another content) does too, since within an epoch that happens only after
// the store lost a write. A document of another epoch always does, whatever
// its version: the store lost acknowledged writes and counts again, and its
// lower versions are the newer ones.
func Supersedes(version uint64, etag string, pubVersion uint64, pubETag string) bool {
	switch {
	case ETagEpoch(etag) != ETagEpoch(pubETag):
		return true
	case version != pubVersion:
		return version > pubVersion
	default:
		return etag != pubETag && ETagEpoch(etag) != ""
	}
}

// ETagEpoch returns the store epoch of a control-plane entity tag
// "v<version>.<epoch>.<sum>" (optionally weak, W/), or "" for a tag of
// another shape, such as the "v7" of control planes that predate epochs.
func ETagEpoch(etag string) string {
	etag = strings.TrimPrefix(etag, "W/")
	if len(etag) < 2 || etag[0] != '"' || etag[len(etag)-1] != '"' || etag[1] != 'v' {
		return ""
	}
	_, rest, ok := strings.Cut(etag[2:len(etag)-1], ".")
	if !ok {
		return ""
	}
	epoch, _, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	return epoch
}

// ETagVersion returns the version of a control-plane entity tag
// "v<version>.<epoch>.<sum>" (optionally weak), and false for a tag of another
// shape or without an epoch. A deleted policy's tag has an empty sum.
func ETagVersion(etag string) (uint64, bool) {
	if ETagEpoch(etag) == "" {
		return 0, false
	}
	etag = strings.TrimPrefix(etag, "W/")
	digits, _, _ := strings.Cut(etag[2:len(etag)-1], ".")
	if digits == "" || len(digits) > 20 {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		if c < '0' || c > '9' || v > (1<<64-1-uint64(c-'0'))/10 {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, v > 0
}
