// Package fleetquota holds the tests of fleet-scoped rules end to end at the
// host level: the real sluice.wasm under the testenv host, leasing quota from
// a real sluice-controlplane process (embedded store) over real HTTP, through
// a reverse proxy that counts and can disturb the quota calls. It has no
// non-test code.
package fleetquota
