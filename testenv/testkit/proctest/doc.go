// Package proctest is the test support shared by the end-to-end suites
// (testenv/suites/e2e, testenv/suites/rulesync): free loopback ports, polling with a
// deadline, child processes the test can kill and start again, and building
// the binaries once in TestMain. The suites' redis-server comes from
// testenv/testkit/redisproc, the one Redis launcher of the repository.
//
// Only tests import it, and it uses the standard library only. Helpers
// that take a testing.TB fail the test (t.Fatal) when what they set up
// does not come up; the others return an error or report a bool. Child
// processes run in their own process group and are killed with SIGKILL,
// so the package needs a Unix system.
package proctest
