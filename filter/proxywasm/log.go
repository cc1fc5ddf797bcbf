package proxywasm

import (
	"runtime"
)

// The host's log level, cached: proxy_get_log_level is read at
// proxy_on_vm_start, proxy_on_configure and every proxy_on_tick, never
// during init (Envoy allows only proxy_log there). Until it is known every
// message goes to the host, which filters by level itself.
var (
	hostLogLevel      LogLevel
	hostLogLevelKnown bool
)

func refreshLogLevel() {
	if level, st := hostGetLogLevel(); st == statusOK {
		hostLogLevel, hostLogLevelKnown = level, true
	}
}

// LogLevelEnabled reports whether a message at level would be emitted,
// according to the host log level last read with proxy_get_log_level (spec
// v0.2.1 "Logging"); before the first read it reports true. Use it to skip
// building expensive messages.
func LogLevelEnabled(level LogLevel) bool {
	return !hostLogLevelKnown || level >= hostLogLevel
}

// Log writes msg at level through proxy_log (spec v0.2.1 "Logging"),
// unless LogLevelEnabled(level) is false. Host errors are ignored. It is
// the only function of this package that may be called from init.
func Log(level LogLevel, msg string) {
	if LogLevelEnabled(level) {
		hostLog(level, msg)
	}
}

// logAlways bypasses the level cache, for this package's own errors.
func logAlways(level LogLevel, msg string) { hostLog(level, msg) }

// LogTrace logs msg at trace level (0) with proxy_log; see Log.
func LogTrace(msg string) { Log(LogLevelTrace, msg) }

// LogDebug logs msg at debug level (1) with proxy_log; see Log.
func LogDebug(msg string) { Log(LogLevelDebug, msg) }

// LogInfo logs msg at info level (2) with proxy_log; see Log.
func LogInfo(msg string) { Log(LogLevelInfo, msg) }

// LogWarn logs msg at warn level (3) with proxy_log; see Log.
func LogWarn(msg string) { Log(LogLevelWarn, msg) }

// LogError logs msg at error level (4) with proxy_log; see Log.
func LogError(msg string) { Log(LogLevelError, msg) }

// LogCritical logs msg at critical level (5) with proxy_log; see Log.
func LogCritical(msg string) { Log(LogLevelCritical, msg) }

// callbackName is the export whose callback is running, for endCallback's
// log; each callback sets it before deferring endCallback.
var callbackName string

// endCallback, deferred by every callback (arguments-free, so the defer is
// a direct call), ends it: it closes the host-scratch scope the callback
// may have left open (a scope never outlives its callback:
// BeginHostScratch), and stops a panic at the export boundary, logging it at
// error level through proxy_log with the stack. The caller has already set
// its fail-open result.
func endCallback() {
	arenaOpen, arenaOff = false, 0
	if r := recover(); r != nil {
		logPanic(callbackName, r)
	}
}

// logPanic logs a panic recovered in the export where.
func logPanic(where string, r any) {
	var stack [4096]byte
	n := runtime.Stack(stack[:], false)
	logAlways(LogLevelError, "proxywasm: recovered panic in "+where+": "+panicString(r)+"\n"+string(stack[:n]))
}

// panicString describes a panic value without fmt: errors and strings as
// themselves, anything else as "panic". An Error method that panics itself
// yields "panic".
func panicString(r any) (s string) {
	s = "panic"
	defer func() { _ = recover() }()
	switch v := r.(type) {
	case error:
		s = v.Error()
	case string:
		s = v
	}
	return s
}
