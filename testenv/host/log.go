package host

// Logging: proxy_log (spec v0.2.1 "Logging"), kept per stream and per host.

func hostLog(v *vm, s []uint64) status {
	msg, ok := v.readString(uint32(s[1]), uint32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	lvl := LogLevel(int32(s[0]))
	if lvl < v.h.cfg.LogLevel {
		return statusOK
	}
	v.log(lvl, msg, "proxy_log")
	return statusOK
}

func (v *vm) log(lvl LogLevel, msg, source string) {
	e := LogEntry{Worker: v.index, ContextID: v.effective, Level: lvl, Message: msg}
	if st := v.streams[v.effective]; st != nil {
		st.logs = append(st.logs, e)
	}
	v.h.addLog(e, source)
}

// effectiveStream is the stream of the effective context, or nil on a
// root context.
func (v *vm) effectiveStream() *stream { return v.streams[v.effective] }
