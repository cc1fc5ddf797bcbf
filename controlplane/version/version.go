// Package version is the release every sluice binary reports with --version and
// the images carry as org.opencontainers.image.version.
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is the release: set by make at link time (-ldflags "-X
// github.com/sluice-proxy/sluice/controlplane/version.Version=$(VERSION)", where
// VERSION is `git describe --tags --always --dirty`, the value the image labels
// get too). Empty in a plain `go build`: String then falls back to the build
// information Go records.
var Version string

// License is the SPDX identifier of the licence sluice is released under (the
// LICENSE file; label org.opencontainers.image.licenses).
const License = "Apache-2.0"

// String is what --version prints after the binary's name: the release, then the
// commit and the Go release it was built with, e.g. "v0.3.1 (commit 1a2b3c4d5e6f,
// go1.26.0)". Without a release set at link time it is the module version Go
// recorded ("(devel)" for a build from a checkout).
func String() string {
	v, commit, modified := Version, "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	out := v + " ("
	if commit != "" {
		if len(commit) > 12 {
			commit = commit[:12]
		}
		out += "commit " + commit
		if modified {
			out += "-dirty"
		}
		out += ", "
	}
	return out + runtime.Version() + ")"
}
