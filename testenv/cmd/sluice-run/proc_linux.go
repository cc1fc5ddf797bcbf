package main

import "syscall"

// sysProcAttr puts a child in its own process group (so a signal to it
// reaches its own children too) and has the kernel send it SIGTERM if
// sluice-run dies without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
