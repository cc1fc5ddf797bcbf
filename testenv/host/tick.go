package host

import (
	"context"
	"time"
)

// setTick (re)arms the root context's tick timer on the Host's clock;
// 0 disables it. Runs on the loop.
func (v *vm) setTick(periodMS uint32) {
	v.stopTick()
	v.tickPeriodMS = periodMS
	if periodMS == 0 || v.index < 0 {
		// The canary is killed right after on_configure; its ticks never
		// fire (CPPHOST canary).
		return
	}
	v.armTick()
}

func (v *vm) stopTick() {
	v.tickGen++
	if v.tickStop != nil {
		v.tickStop()
		v.tickStop = nil
	}
}

func (v *vm) armTick() {
	gen := v.tickGen
	d := time.Duration(v.tickPeriodMS) * time.Millisecond
	v.tickStop = v.h.clock.AfterFunc(d, func() {
		// Runs on the clock's goroutine (VirtualClock.Advance or a real
		// timer); the tick itself runs on the VM's loop and this waits
		// for it, so Advance returns after delivery.
		calls := 0
		_ = v.run(context.Background(), func() error {
			if gen != v.tickGen || v.failed != nil {
				return nil
			}
			// ENVOY-WASM tickHandler: on_tick (if exported), then the
			// timer is re-armed for another period.
			_, err := v.callback("proxy_on_tick", uint64(v.rootID))
			if gen == v.tickGen && v.failed == nil {
				v.armTick()
			}
			calls = v.inlineCalls
			return err
		})
		if calls > 0 {
			v.drainInline()
		}
	})
}

// drainInline returns when the answers of every inline call of the VM have
// been delivered: each visit to the loop runs after the deliveries queued
// before it.
func (v *vm) drainInline() {
	for {
		n := 0
		if err := v.run(context.Background(), func() error { n = v.inlineCalls; return nil }); err != nil || n == 0 {
			return
		}
	}
}

func hostSetTickPeriod(v *vm, s []uint64) status {
	// CPPHOST ContextBase::setTimerPeriod keys the timer by the root
	// context; Envoy arms one timer per root context on the VM's
	// dispatcher, first fire after one period (ENVOY-WASM setTimerPeriod).
	v.setTick(uint32(s[0]))
	return statusOK
}
