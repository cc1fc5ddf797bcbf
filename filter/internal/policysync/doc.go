// Package policysync pulls the rate-limit policy from the control plane
// into every worker VM of one Envoy (DESIGN.md §6): one worker holds a sync
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
//     call timeout a little above the wait. A 304, or the timeout, starts
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
// All values are little-endian. Envoy cannot delete shared-data keys, so the
// key space per policy is fixed: one lease, one meta, at most 2 × MaxChunks
// chunks.
//
//	sluice/sync/<policy>/lease         Lease: holder VM token u64, expiry Unix ns i64
//	sluice/policy/<policy>/meta        Meta: "SPM1", version u64, generation u64,
//	                                   length u32, chunks u32, FNV-1a-64 checksum u64,
//	                                   ETag length u16, ETag
//	sluice/policy/<policy>/chunk/<s>/<i>  generation u64, then bytes
//	                                   [i×ChunkBytes, (i+1)×ChunkBytes) of the document
//
// The lease: each instance draws a random 64-bit token at start. On its tick
// an instance writes {its token, now + Lease} by compare-and-swap if the
// lease is free, expired or already its own; so the holder renews it every
// tick, and when the holder dies its lease passes to another worker within
// Lease plus one tick. The lease key is created free at plugin start (Envoy
// configures a canary VM on the main thread before any worker), so workers
// only ever take it by compare-and-swap. A holder whose poll was in flight
// when it lost the lease drops the result. Lease defaults to max(1 s, 10
// ticks); a holder stopped gracefully (proxy_on_done) releases it.
//
// Publishing: the holder writes the document's chunks into slot s =
// generation & 1 — the slot the current meta does not point to, so readers
// of the current generation are never disturbed and a holder dying half-way
// leaves the current publication intact — then the meta by compare-and-swap
// on the meta's cas. A generation's chunks carry the generation, so a reader
// that read the meta of generation g and then chunks already overwritten by
// g+2 notices and retries.
//
// # Policy precedence
//
// Until the first policy is applied the plugin uses the static rules of its
// configuration (or lets traffic through, with filter state
// reason=no_policy); once a pulled policy has been applied it always wins.
// The last good policy is kept in every VM and in shared data, so it
// survives a control-plane outage of any length.
//
// # Metrics
//
// MetricVersion (gauge), MetricSyncSuccesses (counter),
// MetricSyncFailuresPrefix + kind (counters, one per FailureKind) and
// MetricLastSync (gauge, Unix seconds).
//
// # Design choices
//
//   - Two chunk slots, not one: with a single slot a holder that died
//     between its first chunk and its meta would leave the current meta
//     pointing at mixed chunks, and every worker started afterwards would
//     have no policy until the next change. Two slots cost at most
//     MaxChunks more keys.
//   - The lease key is created free in Start (proxy_on_configure), which
//     Envoy runs in its canary on the main thread before any worker exists:
//     Envoy creates an absent key whatever the cas, so two workers creating
//     it at once could both believe they won. Tick creates it only if no
//     canary did (a host without one), and the loser of that rare race
//     finds out at its next renewal.
//   - Workers check the meta on the request path too (at most every
//     RequestCheckInterval, one shared-data read of about 50 bytes), so under
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
