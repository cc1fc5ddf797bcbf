package proctest

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"
)

// PollInterval is how long WaitFor sleeps between two checks of its
// condition: 10 milliseconds.
const PollInterval = 10 * time.Millisecond

// FreeAddr returns a loopback address "127.0.0.1:port" with a port nobody
// listens on now. It fails the test if no port can be had.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// FreeAddrs returns n loopback addresses as FreeAddr does, with n distinct
// ports: every port is held until all are found (FreeAddr called n times may
// return one port twice, once its listener is closed).
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return addrs
}

// WaitFor checks cond every PollInterval until it holds or limit (wall
// time) has passed, and reports whether it held. It bounds a wait; tests
// never assert a timing with it.
func WaitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(PollInterval)
	}
}

// SyncBuffer is an io.Writer that a process's stdout and stderr may share
// with readers in other goroutines. The zero value is ready to use.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
