package policysync

import (
	"errors"
	"strconv"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// The follower role, which every worker plays: read the published policy on
// tick (and at most every few milliseconds on the request path), compile it
// and swap it in.

// refresh reads the published meta and, if it names a generation not yet
// applied, reads, verifies, parses, compiles and applies its document. A
// torn read is left for the next check; a document that does not compile
// here is logged once and skipped until the next publication.
func (s *Syncer) refresh(now int64) {
	s.lastCheck = now
	val, _, err := s.h.GetSharedData(s.metaKey)
	if err != nil {
		return
	}
	m, ok := DecodeMeta(val)
	if !ok || !m.Published() || m.Generation == s.appliedGen || m.Generation == s.badGen {
		return
	}
	if m.Deleted() {
		if err := s.install(nil, m.Version, m.Generation); err != nil {
			s.badGen = m.Generation
			s.log.warn("dropping the deleted policy failed: " + clip(err.Error()))
		}
		return
	}
	doc, ok := s.readChunks(m)
	if !ok {
		return // torn: a newer publication retired these chunks meanwhile
	}
	c, err := s.compile(doc)
	if err == nil {
		err = s.install(c, c.Version, m.Generation)
	}
	if err != nil {
		s.badGen = m.Generation
		s.log.warn("published version " + strconv.FormatUint(m.Version, 10) + " (generation " + strconv.FormatUint(m.Generation, 10) +
			") rejected, keeping version " + strconv.FormatUint(s.appliedVersion, 10) + ": " + clip(err.Error()))
	}
}

func (s *Syncer) readChunks(m Meta) ([]byte, bool) {
	a := NewAssembler(m)
	for i := range int(m.Chunks) {
		v, _, err := s.h.GetSharedData(ChunkKey(s.o.Policy, m.Generation, i))
		if err != nil || !a.Add(i, v) {
			return nil, false
		}
	}
	return a.Document()
}

// compile parses and compiles a policy document and checks it is the
// policy this Syncer pulls.
func (s *Syncer) compile(doc []byte) (*rules.Compiled, error) {
	p, err := rules.ParsePolicy(doc)
	if err != nil {
		return nil, err
	}
	if p.Name != s.o.Policy {
		return nil, errors.New("policy is named " + strconv.Quote(clip(p.Name)) + ", want " + strconv.Quote(s.o.Policy))
	}
	c, err := rules.Compile(p, s.o.Compile)
	if err != nil {
		return nil, err
	}
	if s.o.Check != nil {
		if err := s.o.Check(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// install hands c to Apply and records it as version of generation gen; a nil
// c is the policy's deletion at that version (Apply(nil): enforce none).
func (s *Syncer) install(c *rules.Compiled, version, gen uint64) error {
	if err := s.o.Apply(c); err != nil {
		return err
	}
	s.appliedGen, s.appliedVersion = gen, version
	if c == nil {
		s.h.Gauge(MetricVersion, 0)
		s.log.info("policy deleted at the control plane (version " + strconv.FormatUint(version, 10) + "): no longer enforced")
		return nil
	}
	s.h.Gauge(MetricVersion, version)
	s.log.debug("applied policy version " + strconv.FormatUint(version, 10) + " (generation " + strconv.FormatUint(gen, 10) + ")")
	return nil
}
