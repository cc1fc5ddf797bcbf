package limit

// Temporary: the algorithms land in the next commits.

type stub struct{ c Config }

func (s stub) Config() Config      { return s.c }
func (s stub) StateSize() int      { return 16 }
func (s stub) Fingerprint() uint32 { return 0 }
func (s stub) Decide(state, next []byte, now int64, cost uint64) Decision {
	return Decision{Allowed: true}
}
func (s stub) Adjust(state, next []byte, now int64, delta int64) bool              { return false }
func (s stub) Release(state, next []byte, now, acquiredAt int64, cost uint64) bool { return false }
func (s stub) Idle(state []byte, now int64) bool                                   { return true }

func newTAT(c Config) Limiter         { return stub{c} }
func newTimeWheel(c Config) Limiter   { return stub{c} }
func newFixedWindow(c Config) Limiter { return stub{c} }
func newSlidingLog(c Config) Limiter  { return stub{c} }
func newConcurrency(c Config) Limiter { return stub{c} }
