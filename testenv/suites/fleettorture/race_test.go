//go:build race

package fleettorture

// raceDetector reports whether the tests run under the race detector, which
// slows a simulated fleet of thousands enough to change what it demands.
const raceDetector = true
