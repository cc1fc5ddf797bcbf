// Command sluice-image builds and pushes sluice's release images without a
// Docker daemon (package internal/ociimage); `make image` and `make push`
// run it.
//
//	sluice-image build -out build/oci -wasm build/sluice.wasm \
//	    -controlplane linux/amd64=build/linux-amd64/sluice-controlplane,linux/arm64=... \
//	    -version v0.3.1 -source https://... -revision <commit> -epoch <unix seconds>
//	sluice-image push -out build/oci -repo registry.example.com/sluice -version v0.3.1
//
// build writes the OCI image layouts build/oci/sluice-wasm and
// build/oci/sluice-controlplane and prints their digests; push pushes both
// as <repo>/<name>:<version> with the Docker config's credentials
// (authn.DefaultKeychain) and prints each immutable reference
// <repo>/<name>@sha256:… to put in the manifests.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sluice-proxy/sluice/internal/ociimage"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "build" && args[0] != "push") {
		fmt.Fprintln(stderr, "usage: sluice-image build|push [flags]  (-h for the flags)")
		return 2
	}
	fs := flag.NewFlagSet("sluice-image "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "build/oci", "directory of the OCI image layouts")
	version := fs.String("version", "dev", "release version: image label and tag")
	wasm := fs.String("wasm", "build/sluice.wasm", "build: the filter module")
	cps := fs.String("controlplane", "", "build: comma-separated os/arch=path of static control plane binaries")
	source := fs.String("source", "https://github.com/sluice-proxy/sluice", "build: org.opencontainers.image.source")
	revision := fs.String("revision", "", "build: org.opencontainers.image.revision (the commit)")
	epoch := fs.String("epoch", "0", "build: every timestamp in the images, Unix seconds (SOURCE_DATE_EPOCH or the commit time)")
	repo := fs.String("repo", "", "push: repository prefix, e.g. registry.example.com/sluice")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	var err error
	if args[0] == "build" {
		err = build(stdout, *out, *wasm, *cps, *version, *source, *revision, *epoch)
	} else {
		err = push(stdout, *out, *repo, *version)
	}
	if err != nil {
		fmt.Fprintln(stderr, "sluice-image:", err)
		return 1
	}
	return 0
}

func build(stdout io.Writer, out, wasmPath, cps, version, source, revision, epoch string) error {
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil || secs < 0 {
		return fmt.Errorf("-epoch %q: want Unix seconds ≥ 0", epoch)
	}
	in := ociimage.Inputs{}
	if in.Wasm, err = os.ReadFile(wasmPath); err != nil {
		return fmt.Errorf("-wasm: %w", err)
	}
	for _, e := range strings.Split(cps, ",") {
		if e == "" {
			continue
		}
		plat, path, ok := strings.Cut(e, "=")
		p, perr := v1.ParsePlatform(plat)
		if !ok || perr != nil || p.OS == "" || p.Architecture == "" {
			return fmt.Errorf("-controlplane %q: want os/arch=path", e)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("-controlplane %s: %w", plat, err)
		}
		in.ControlPlane = append(in.ControlPlane, ociimage.Binary{Platform: *p, Data: b})
	}
	if len(in.ControlPlane) == 0 {
		return errors.New("-controlplane: no binary given")
	}
	m := ociimage.Meta{Version: version, Source: source, Revision: revision, Created: time.Unix(secs, 0).UTC()}
	d, err := ociimage.Build(out, in, m)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s/%s\t%s\t(%d bytes of Wasm)\n", out, ociimage.WasmName, d.Wasm, len(in.Wasm))
	fmt.Fprintf(stdout, "%s/%s\t%s\n", out, ociimage.ControlPlaneName, d.ControlPlane)
	return nil
}

func push(stdout io.Writer, out, repo, version string) error {
	pushed, err := ociimage.Push(out, repo, version)
	for _, p := range pushed {
		fmt.Fprintf(stdout, "pushed %s\n  %s\n", p.Tag, p.Ref())
	}
	return err
}
