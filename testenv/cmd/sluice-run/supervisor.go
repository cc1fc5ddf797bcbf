package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// supervisor starts the child processes, each in its own process group, and
// stops them all.
type supervisor struct {
	mu     sync.Mutex
	procs  []*child
	exited chan string // names of children that exited on their own
}

type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	stop bool
}

// start runs bin with args, output appended to runDir/<name>.log.
func (s *supervisor) start(st settings, name, bin string, args, env []string) error {
	logf, err := os.OpenFile(filepath.Join(st.runDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w (did `make build` run?)", bin, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	s.mu.Lock()
	s.procs = append(s.procs, c)
	s.mu.Unlock()
	go func() {
		cmd.Wait()
		logf.Close()
		s.mu.Lock()
		stopping := c.stop
		s.mu.Unlock()
		close(c.done)
		if !stopping {
			select {
			case s.exited <- name:
			default:
			}
		}
	}()
	return nil
}

// pause sleeps d, returning early with an error if ctx ends or a child
// exits.
func (s *supervisor) pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case name := <-s.exited:
		s.exited <- name
		return &exitError{name}
	case <-time.After(d):
		return nil
	}
}

// stopAll sends SIGTERM to every child's process group, newest first, and
// SIGKILL to those still running 5 seconds later.
func (s *supervisor) stopAll() {
	s.mu.Lock()
	procs := append([]*child(nil), s.procs...)
	for _, c := range procs {
		c.stop = true
	}
	s.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		c := procs[i]
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			fmt.Fprintf(os.Stderr, "sluice-run: %s did not stop within 5s; killing it\n", c.name)
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.done
		}
		fmt.Fprintf(os.Stderr, "==> stopped %s\n", c.name)
	}
}

// exitError says a child of the run (by its log name: "envoy2", "controlplane")
// exited on its own while the run waited.
type exitError struct{ name string }

func (e *exitError) Error() string { return e.name + " exited" }
