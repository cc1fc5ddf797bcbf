package policysync

import (
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/shared/rules"
)

// The holder's long poll to the control plane: proxy_http_call to the
// configured cluster, the answer validated, then published (publish.go).

func (s *Syncer) maybePoll(now int64) {
	if s.inFlight || now < s.nextPoll {
		return
	}
	s.poll(now)
}

func (s *Syncer) poll(now int64) {
	headers := [][2]string{
		{":method", "GET"},
		{":path", "/v1/policies/" + s.o.Policy + "?wait=" + s.o.Wait.String()},
		{":authority", s.o.Authority},
		{"accept", "application/json"},
	}
	if s.o.Token != "" {
		headers = append(headers, [2]string{"authorization", "Bearer " + s.o.Token})
	}
	if s.etag != "" {
		headers = append(headers, [2]string{"if-none-match", s.etag})
	}
	headers = s.identify(headers)
	s.callSeq++
	seq := s.callSeq
	_, err := s.h.DispatchHttpCall(s.o.Cluster, headers, nil, nil, uint32(s.o.Timeout.Milliseconds()),
		func(numHeaders, bodySize, _ int) { s.onResponse(seq, numHeaders, bodySize) })
	if err != nil {
		s.fail(now, FailDispatch, "proxy_http_call to cluster "+strconv.Quote(s.o.Cluster)+": "+err.Error())
		return
	}
	s.inFlight, s.callStart = true, now
}

// onResponse handles the poll's response, in proxy_on_http_call_response.
func (s *Syncer) onResponse(seq uint64, numHeaders, bodySize int) {
	if seq != s.callSeq || !s.inFlight {
		return
	}
	s.inFlight = false
	now := s.nowNanos()
	// Drop the result unless this instance still holds the lease (renewing
	// it if it lapsed unclaimed), so that two holders never publish.
	s.renewLease(now)
	if !s.holding {
		s.log.debug("dropped a poll result: lease lost while it was in flight")
		return
	}
	if numHeaders == 0 {
		s.fail(now, FailReset, "the call failed without a response (reset)")
		return
	}
	status, _ := s.h.GetHttpCallResponseHeader(":status")
	switch status {
	case "304":
		s.succeed(now)
		s.pollAgain(now, false)
	case "200":
		s.on200(now, bodySize)
	case "404":
		// The control plane names a deletion by its tag; a 404 without one (a
		// policy that never existed, or another server) is a failure, and the
		// last good policy stays.
		etag, _ := s.h.GetHttpCallResponseHeader("etag")
		if v, ok := ETagVersion(etag); ok {
			s.onDeleted(now, v, etag)
			return
		}
		s.fail(now, FailHTTPStatus, "status 404 (no policy "+strconv.Quote(s.o.Policy)+" at the control plane)")
	case "504":
		body, _ := s.h.GetHttpCallResponseBody(0, len(envoyTimeoutBody))
		if string(body) == envoyTimeoutBody || now-s.callStart >= int64(s.o.Timeout) {
			// The call's timeout: the long poll simply ended.
			s.pollAgain(now, false)
			return
		}
		s.fail(now, FailHTTPStatus, "status 504")
	default:
		s.fail(now, FailHTTPStatus, "status "+clip(status))
	}
}

// onDeleted publishes the policy's deletion at version (tag etag) for every
// worker, as on200 publishes a new version: the deletion supersedes the
// versions before it, and a later version supersedes it.
func (s *Syncer) onDeleted(now int64, version uint64, etag string) {
	if etag == s.etag {
		s.succeed(now)
		s.pollAgain(now, false) // known already: wait for the next change
		return
	}
	if s.renewLease(s.nowNanos()); !s.holding {
		return
	}
	prevETag := s.etag
	s.etag = etag
	published, gen, ok := s.publish(nil, version, etag)
	switch {
	case ok:
		defer s.pollAgain(now, true)
		if err := s.install(nil, version, gen); err != nil {
			s.badGen = gen
			s.log.warn("deletion at version " + strconv.FormatUint(version, 10) + " not applied here: " + clip(err.Error()))
		}
	case published >= version:
		defer s.pollAgain(now, false)
	default:
		s.etag = prevETag
		s.fail(now, FailReset, "publishing the deletion at version "+strconv.FormatUint(version, 10)+" failed")
		return
	}
	s.succeed(now)
}

func (s *Syncer) on200(now int64, bodySize int) {
	etag, _ := s.h.GetHttpCallResponseHeader("etag")
	if bodySize > rules.MaxPolicyBytes {
		s.etag = etag // wait for the next change rather than refetch
		s.fail(now, FailTooLarge, "policy of "+strconv.Itoa(bodySize)+" bytes exceeds "+strconv.Itoa(rules.MaxPolicyBytes))
		return
	}
	body, err := s.h.GetHttpCallResponseBody(0, bodySize)
	if err != nil && bodySize > 0 {
		s.fail(now, FailReset, "reading the response body: "+err.Error())
		return
	}
	if len(body) != bodySize {
		s.fail(now, FailInvalidPolicy, "body of "+strconv.Itoa(len(body))+" bytes, announced "+strconv.Itoa(bodySize))
		return
	}
	c, err := s.compile(body)
	if err != nil {
		s.etag = etag
		s.fail(now, FailInvalidPolicy, "invalid policy (etag "+clip(etag)+"), keeping version "+strconv.FormatUint(s.appliedVersion, 10)+": "+err.Error())
		return
	}
	if s.o.Prepare != nil {
		if err := s.o.Prepare(c); err != nil {
			s.fail(now, FailReset, "preparing version "+strconv.FormatUint(c.Version, 10)+": "+err.Error())
			return
		}
	}
	// Compiling and preparing take time; the lease may have lapsed
	// meanwhile and passed to another worker. Take it again (by
	// compare-and-swap) before publishing, or leave the publishing to the
	// new holder. Publication is safe without this (see publish); it saves
	// the work and keeps one publisher the rule.
	if s.renewLease(s.nowNanos()); !s.holding {
		s.log.debug("dropped a poll result: lease lost while preparing version " + strconv.FormatUint(c.Version, 10))
		return
	}
	prevETag := s.etag
	s.etag = etag
	published, gen, ok := s.publish(body, c.Version, etag)
	switch {
	case ok:
		defer s.pollAgain(now, true)
		s.log.info("published policy version " + strconv.FormatUint(c.Version, 10) + " (" + strconv.Itoa(len(body)) + " bytes, generation " + strconv.FormatUint(gen, 10) + ")")
		if err := s.install(c, c.Version, gen); err != nil {
			s.badGen = gen
			s.log.warn("published version " + strconv.FormatUint(c.Version, 10) + " not applied here: " + clip(err.Error()))
		}
	case published >= c.Version:
		if published > c.Version {
			s.log.warn("control plane served version " + strconv.FormatUint(c.Version, 10) + " of the same epoch, below the published " + strconv.FormatUint(published, 10) +
				" (a control-plane replica behind?); keeping " + strconv.FormatUint(published, 10))
		}
		defer s.pollAgain(now, false)
	default:
		// Not published: fetch it again after the backoff, rather than
		// have the control plane answer 304 to its ETag.
		s.etag = prevETag
		s.fail(now, FailReset, "could not publish version "+strconv.FormatUint(c.Version, 10)+": shared data changed meanwhile")
		return
	}
	s.succeed(now)
}

func (s *Syncer) succeed(now int64) {
	s.h.Counter(MetricSyncSuccesses, 1)
	s.h.Gauge(MetricLastSync, uint64(max(now, 0)/int64(time.Second)))
	if s.failing {
		s.log.info("sync recovered after " + strconv.Itoa(s.backoff.Failures()) + " failed polls (last: " + string(s.lastFailure) + ")")
		s.failing = false
	}
	s.backoff.Reset()
}

// pollAgain starts the next poll right away if the lease is still held.
// An answer that brought no change (304, timeout, a version already
// published) less than MinPollSpacing after its poll started defers the
// next poll until then, to the tick: a control plane or proxy that ignores
// ?wait costs at most one request per MinPollSpacing, not a busy loop.
func (s *Syncer) pollAgain(now int64, changed bool) {
	s.nextPoll = now
	if !changed && now-s.callStart < int64(MinPollSpacing) && now >= s.callStart {
		s.nextPoll = s.callStart + int64(MinPollSpacing)
		return
	}
	if s.holding {
		s.poll(now)
	}
}

func (s *Syncer) fail(now int64, kind FailureKind, reason string) {
	s.h.Counter(MetricSyncFailuresPrefix+string(kind), 1)
	wait := s.backoff.Next()
	s.nextPoll = now + int64(wait)
	s.lastFailure = kind
	switch {
	case kind == FailInvalidPolicy || kind == FailTooLarge:
		// Each rejected document is its own event (the ETag keeps the next
		// poll from refetching it), so it is always logged.
		s.log.warn("rejected: " + clip(reason))
	case !s.failing:
		s.log.warn("sync failing (" + string(kind) + "): " + clip(reason) + "; retrying with backoff")
	}
	s.failing = true
}

// Build names this filter build in the poll's x-sluice-build header; set
// it at link time (go build -ldflags "-X <package path>.Build=v1.2.3").
var Build = "dev"

// PropertyReader is implemented by a Host that can read Envoy properties
// (proxy_get_property); ProxyWasm's does. Without it the poll does not
// name its Envoy.
type PropertyReader interface {
	// GetProperty is proxywasm.GetProperty.
	GetProperty(path []string) ([]byte, error)
}

// nodeIDPaths are where the Envoy's node id is read, first found wins:
// the xds attributes (Envoy ≥ 1.33 serves only these; Envoy's attributes
// doc, docs/root/intro/arch_overview/advanced/attributes.rst), then the
// top-level node of older Envoys.
var nodeIDPaths = [][]string{{"xds", "node", "id"}, {"node", "id"}}

// identify appends the headers by which the control plane's status knows
// this Envoy: x-sluice-node (its node id, read once), x-sluice-version
// (the entity tag of the published policy this worker applied, if any) and
// x-sluice-build (Build). Without a node id none is sent.
func (s *Syncer) identify(headers [][2]string) [][2]string {
	if !s.nodeRead {
		s.nodeRead = true
		if pr, ok := s.h.(PropertyReader); ok {
			for _, path := range nodeIDPaths {
				if v, err := pr.GetProperty(path); err == nil && len(v) > 0 {
					s.node = headerSafe(string(v))
					break
				}
			}
		}
	}
	if s.node == "" {
		return headers
	}
	headers = append(headers, [2]string{"x-sluice-node", s.node}, [2]string{"x-sluice-build", Build})
	if s.appliedGen != 0 {
		if m, _, ok := s.readMeta(); ok && m.Generation == s.appliedGen && m.ETag != "" {
			headers = append(headers, [2]string{"x-sluice-version", m.ETag})
		}
	}
	return headers
}

// headerSafe keeps at most 128 bytes of visible ASCII of v, so that a node
// id is a valid header value (RFC 9110 §5.5).
func headerSafe(v string) string {
	b := make([]byte, 0, min(len(v), 128))
	for i := 0; i < len(v) && len(b) < 128; i++ {
		if c := v[i]; c > 0x20 && c < 0x7f {
			b = append(b, c)
		}
	}
	return string(b)
}
