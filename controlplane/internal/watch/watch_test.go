package watch

import (
	"sync"
	"testing"
	"time"
)

func TestNotifyWakesAllWaiters(t *testing.T) {
	h := New()
	const n = 1000
	var wg sync.WaitGroup
	ready := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		ch, release := h.Watch("p")
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer release()
			ready <- struct{}{}
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Error("waiter not woken")
			}
		}()
	}
	for i := 0; i < n; i++ {
		<-ready
	}
	h.Notify("p")
	wg.Wait()
	if got := h.Waiting(); got != 0 {
		t.Fatalf("Waiting() = %d after all released, want 0", got)
	}
}

func TestNotifyOtherKeyDoesNotWake(t *testing.T) {
	h := New()
	ch, release := h.Watch("a")
	defer release()
	h.Notify("b")
	select {
	case <-ch:
		t.Fatal("woken by another key")
	default:
	}
	h.Notify("a")
	select {
	case <-ch:
	default:
		t.Fatal("not woken by its key")
	}
	// A new watch after the notify gets a fresh channel.
	ch2, release2 := h.Watch("a")
	defer release2()
	select {
	case <-ch2:
		t.Fatal("fresh channel already closed")
	default:
	}
}

func TestReleaseIsIdempotentAndBounded(t *testing.T) {
	h := New()
	_, r1 := h.Watch("a")
	_, r2 := h.Watch("a")
	r1()
	r1()
	if got := h.Waiting(); got != 1 {
		t.Fatalf("Waiting() = %d, want 1", got)
	}
	r2()
	if got := h.Waiting(); got != 0 {
		t.Fatalf("Waiting() = %d, want 0", got)
	}
}
