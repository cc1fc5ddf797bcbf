package host

// Profile selects the parts of Envoy's WASI surface that changed between
// Envoy releases. It follows proxy-wasm-cpp-host (CPPHOST) src/exports.cc,
// which Envoy embeds; see docs/ENVOY.md, WASI and the poll_oneoff crash.
//
// The zero Profile means EnvoyPrePR533.
type Profile struct {
	// Name identifies the profile in errors and logs.
	Name string
	// PollOneoffENOSYS makes wasi poll_oneoff fail with ENOSYS (52), as
	// CPPHOST did from PR #427 (Envoy 1.33) until PR #533. When false,
	// poll_oneoff succeeds with zero events without sleeping (PR #533).
	PollOneoffENOSYS bool
	// PollOneoffInAllocator allows poll_oneoff while the host runs the
	// guest's allocator (malloc / proxy_on_memory_allocate). PR #533 added
	// it to the allow-list ("Go calls sleep" during GC); before it the
	// call traps with restricted_callback (CPPHOST include/proxy-wasm/wasm.h
	// WasmBase::allocMemory).
	PollOneoffInAllocator bool
	// StdioCharDevice makes fd_fdstat_get report fds 0..2 as character
	// devices. When false, fd_fdstat_get answers only fds 1 and 2, with
	// filetype UNKNOWN (0) and fs_rights_base FD_WRITE, and EBADF for every
	// other fd, as CPPHOST's long-standing implementation does.
	// [UNCONFIRMED] for PR #533's exact stdio answer.
	StdioCharDevice bool
}

var (
	// EnvoyPrePR533 is Envoy ≥ 1.33 with proxy-wasm-cpp-host before PR #533:
	// poll_oneoff returns ENOSYS, which crashes a Go guest whose runtime
	// poller is initialised (a guest that imports os) at its first GC
	// (golang/go#78513). This is the default and the stricter profile.
	EnvoyPrePR533 = Profile{Name: "envoy-pre-pr533", PollOneoffENOSYS: true}
	// EnvoyPostPR533 is an Envoy whose proxy-wasm-cpp-host includes PR #533
	// (commit 94091cd, merged 2026-04-06): poll_oneoff succeeds with zero
	// events and may run inside the allocator.
	EnvoyPostPR533 = Profile{Name: "envoy-post-pr533", PollOneoffInAllocator: true, StdioCharDevice: true}
)

func (p Profile) orDefault() Profile {
	if p == (Profile{}) {
		return EnvoyPrePR533
	}
	return p
}
