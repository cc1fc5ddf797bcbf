// Package policysync pulls the rate-limit policy from the control plane
// into every worker VM of one Envoy: one worker holds a sync
// lease and keeps one long poll open; what it receives is validated and
// published in shared data; every worker applies the published policy on
// its tick, or sooner on the request path.
//
// # Roles
//
// Every plugin instance (one root context per worker VM) runs a Syncer.
//
//   - Follower (every instance): on each tick, and at most every
//     RequestCheckInterval from the request path, it reads the published
//     meta (one small shared-data read). When the meta names a generation it
//     has not applied, it reads the chunks, checks their generation, length
//     and checksum against the meta, parses them with rules.ParsePolicy,
//     compiles them and calls Options.Apply, which swaps the plugin's
//     compiled policy between two requests. A torn read fails the checks and
//     is retried on the next tick.
//   - Lease holder (one instance per Envoy): the instance whose token is in
//     the lease key keeps exactly one GET /v1/policies/{policy}?wait=<Wait>
//     in flight through proxy_http_call to Options.Cluster, with
//     If-None-Match (the ETag of what it last saw) and the read token, and a
//     call timeout a little above the wait. The poll also names its Envoy
//     for the control plane's status (identify, poll.go): x-sluice-node
//     (the node id, property xds.node.id or node.id, read once),
//     x-sluice-version (the ETag of the published policy this instance
//     applied) and x-sluice-build (Build); requests carry none of them. A 304, or the timeout, starts
//     the next poll at once (but no sooner than MinPollSpacing after the
//     previous one started, so a server that ignores ?wait cannot make the
//     holder spin). A 200 is size-limited (rules.MaxPolicyBytes),
//     parsed, validated, compiled and, if it supersedes the published one
//     (a higher version, or another store epoch: Supersedes), published;
//     an invalid one is logged with the reason and counted, and the last
//     good policy stays. Other statuses and
//     failures back off (Backoff: 100 ms to 30 s, exponential, with jitter)
//     before the next poll, which the tick then starts. The holder logs when
//     sync starts failing and when it recovers, not per attempt.
//
// # Shared data
//
// All values are little-endian. Envoy cannot delete shared-data keys (a
// value can only be overwritten, e.g. shrunk to empty); see "Key growth".
//
//	sluice/sync/<policy>/lease         Lease: holder VM token u64, expiry Unix ns i64
//	sluice/policy/<policy>/meta        Meta: "SPM2", version u64, generation u64,
//	                                   claimed u64, length u32, chunks u32,
//	                                   FNV-1a-64 checksum u64, ETag length u16, ETag
//	                                   (empty: created, nothing published yet)
//	sluice/policy/<policy>/chunk/<g>/<i>  generation g u64, then bytes
//	                                   [i×ChunkBytes, (i+1)×ChunkBytes) of the document
//
// The lease: each instance draws a random 64-bit token at start. On its tick
// an instance writes {its token, now + Lease} by compare-and-swap if the
// lease is free, expired or already its own; so the holder renews it every
// tick, and when the holder dies its lease passes to another worker within
// Lease plus one tick. The lease and meta keys are created at plugin start
// (Envoy configures a canary VM on the main thread before any worker), so
// workers only ever write them by compare-and-swap. A holder whose poll was
// in flight when it lost the lease drops the result, and a holder takes the
// lease again by compare-and-swap after compiling and preparing a policy,
// just before publishing it. Lease defaults to max(1 s, 10 ticks); a
// holder stopped gracefully (its root context deleted) releases it.
//
// Publishing is safe against a concurrent publisher whatever the timing
// (the lease keeps publishers to one in the normal case, but a holder can
// stall past its lease): the meta is the only key publishers contend on,
// and every write to it is a compare-and-swap.
//
//  1. Claim: the publisher reads the meta and writes it back with Claimed
//     incremented; the winner owns generation g = Claimed alone.
//  2. It writes the document's chunks under generation g's own keys, which
//     no other publisher ever writes and no reader follows yet.
//  3. Commit: it reads the meta again and, unless the meta already holds a
//     version ≥ its own, writes {version, generation g, ...} by
//     compare-and-swap on that read. This write is the commit point.
//
// So the published version never goes down (the check and the write see
// the same meta), and a published generation's chunks were complete before
// its meta and are never rewritten. After a commit the publisher shrinks
// the replaced generation's chunks to empty; a publication that lost
// shrinks its own. A reader that read the old meta and then a shrunk chunk
// sees a torn read (each chunk starts with its generation, and the meta
// carries length and checksum) and reads the new meta on its next check.
// A meta that does not decode (e.g. the "SPM1" format of an older module
// sharing the vm_id) reads as nothing published; the next claim replaces
// it, still by compare-and-swap.
//
// # Key growth
//
// Each publication uses new chunk keys (at most MaxChunks); once replaced
// they hold empty values, so what stays per publication is the keys
// themselves (Envoy's per-entry overhead plus a key of about 40 bytes),
// until Envoy restarts. Publications happen once per policy change.
//
// # Policy precedence
//
// Until the first policy is applied the plugin uses the static rules of its
// configuration (or lets traffic through, with filter state
// reason=no_policy); once a pulled policy has been applied it always wins.
// The last good policy is kept in every VM and in shared data, so it
// survives a control-plane outage of any length. A deletion is not an outage:
// the control plane answers 404 with the deleted version's entity tag, and the
// lease holder publishes the deletion like a version (an empty document at that
// version, Meta.Deleted); every worker then goes back to the static rules, or to
// none (Options.Apply(nil)), and only a later version supersedes it. A 404
// without such a tag (a policy that never existed, or another server behind the
// cluster) is a failure that keeps the last good policy.
//
// # Metrics
//
// MetricVersion (gauge), MetricSyncSuccesses (counter),
// MetricSyncFailuresPrefix + kind (counters, one per FailureKind) and
// MetricLastSync (gauge, Unix seconds).
//
// # Design choices
//
//   - Chunk keys per generation, not two alternating slots: with shared
//     slots a publisher that stalled (its lease lapsed while it compiled)
//     could overwrite chunks another publisher had just committed, leaving
//     a torn publication until the next change, and a first meta written
//     without compare-and-swap could replace a newer one. Claimed
//     generations give each publisher keys nobody else writes; the cost is
//     one set of chunk keys per publication (see "Key growth").
//   - The lease and meta keys are created in Start (proxy_on_configure),
//     which Envoy runs in its canary on the main thread before any worker
//     exists. Envoy creates an absent key whatever the cas, so a creating
//     write carries the cas of another key read just before (no write to
//     this key can have had it: cas values come from one global counter),
//     and a VM that lost the race to create a key fails instead of
//     overwriting what the winner wrote since.
//   - Workers check the meta on the request path too (at most every
//     RequestCheckInterval, one shared-data read of about 60 bytes), so under
//     traffic a change is enforced within milliseconds of its publication;
//     idle workers pick it up within one tick.
//   - The callout timeout is told from a control-plane 504 by Envoy's body
//     "upstream request timeout" or by the time the call took: a timeout
//     starts the next poll, a 504 backs off.
//   - A version below the published one of the same store epoch (the
//     middle part of the control plane's ETag "v<version>.<epoch>.<sum>",
//     see Supersedes) is not published; it is logged: it comes from a
//     control-plane replica that is behind, and the published policy only
//     moves forward within an epoch. A document of another epoch is
//     published whatever its version: the control plane's store lost
//     acknowledged writes and counts again from a lower number (refusing it
//     would keep the lost policy in force and ignore every later write).
//
// # Failure policy
//
// Nothing here panics on bytes from the network or from shared data: a
// response body is hostile input, checked for size and parsed strictly, and
// malformed shared-data values read as absent. Trouble is logged, counted
// and retried; the applied policy only ever changes to a policy that
// compiled.
package policysync
