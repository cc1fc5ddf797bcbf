package host

import "context"

// ErrKilled is what a worker stopped with Worker.Kill returns from Do and
// Failed (it also matches ErrVMFailed).
var ErrKilled = killedError{}

type killedError struct{}

func (killedError) Error() string        { return "host: worker killed" }
func (killedError) Is(target error) bool { return target == ErrVMFailed }

// Kill stops worker w as if its thread had died: its tick timer is
// cancelled and no callback reaches its VM again — no tick, no HTTP-call
// response (a callout in flight completes on the network, and its answer
// is dropped), no stream callback, and no proxy_on_done. The other workers
// and the shared data are untouched. Tests use it to see work that one
// worker held (e.g. a lease in shared data) pass to the others. It is safe
// to call more than once.
func (w *Worker) Kill() {
	_ = w.v.run(context.Background(), func() error {
		w.v.stopTick()
		if w.v.failed == nil {
			w.v.failed = ErrKilled
		}
		return nil
	})
}
