// Command sluice-image builds and pushes sluice's release images without a
// Docker daemon (package envoy/ociimage); `make image` and `make push`
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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sluice-proxy/sluice/envoy/ociimage"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "build" && args[0] != "push" && args[0] != "manifests") {
		fmt.Fprintln(stderr, "usage: sluice-image build|push|manifests [flags]  (-h for the flags)")
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
	repo := fs.String("repo", "", "push, manifests: repository prefix, e.g. registry.example.com/sluice")
	src := fs.String("src", "envoy", "manifests: the directory of the manifests to fill in")
	dest := fs.String("dest", "build/manifests", "manifests: where to write them")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	var err error
	switch args[0] {
	case "build":
		err = build(stdout, *out, *wasm, *cps, *version, *source, *revision, *epoch)
	case "push":
		err = push(stdout, *out, *repo, *version)
	default:
		err = manifests(stdout, stderr, *out, *repo, *src, *dest, os.Getenv)
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

// placeholder is the digest the checked-in manifests carry in place of a real one.
var placeholder = "@sha256:" + strings.Repeat("0", 64)

// secretKind matches a YAML document that is a Kubernetes Secret.
var secretKind = regexp.MustCompile(`(?m)^kind: Secret$`)

// minTokenChars is the shortest token manifests accepts: 32 characters (128 bits
// as hex; openssl rand -hex 32 gives 64).
const minTokenChars = 32

// exampleRepo is the repository prefix of the checked-in manifests.
const exampleRepo = "registry.example.com/sluice"

// manifests writes the Kubernetes, Istio and Envoy Gateway manifests of src into
// dest with the images pinned by the digests of the layouts in out, under repo, and
// the proxies' tokens from SLUICE_READ_TOKEN and SLUICE_QUOTA_TOKEN into the
// Secrets that hold them and nowhere else. It fails, writing nothing, when a token
// variable is unset, a placeholder (change-me…) or shorter than minTokenChars,
// or the quota token equals the read token (or SLUICE_ADMIN_TOKEN, when set),
// naming each and echoing no token's value; and if a digest placeholder would remain or a token placeholder
// sits outside a Secret.
func manifests(stdout, stderr io.Writer, out, repo, src, dest string, getenv func(string) string) error {
	if repo == "" {
		return errors.New("-repo: the registry repository the images are (or will be) pushed to, e.g. registry.example.com/sluice")
	}
	repo = strings.TrimSuffix(repo, "/")
	digests := map[string]string{}
	for _, name := range []string{ociimage.WasmName, ociimage.ControlPlaneName} {
		b, err := os.ReadFile(filepath.Join(out, name, "index.json"))
		if err != nil {
			return fmt.Errorf("%s: %w (run make image first)", name, err)
		}
		var idx struct {
			Manifests []struct{ Digest string } `json:"manifests"`
		}
		if err := json.Unmarshal(b, &idx); err != nil || len(idx.Manifests) != 1 || !strings.HasPrefix(idx.Manifests[0].Digest, "sha256:") {
			return fmt.Errorf("%s/%s/index.json: want one manifest with a sha256 digest", out, name)
		}
		digests[name] = idx.Manifests[0].Digest
	}
	images := strings.NewReplacer(
		exampleRepo+"/"+ociimage.WasmName+placeholder, repo+"/"+ociimage.WasmName+"@"+digests[ociimage.WasmName],
		exampleRepo+"/"+ociimage.ControlPlaneName+placeholder, repo+"/"+ociimage.ControlPlaneName+"@"+digests[ociimage.ControlPlaneName],
	)
	pairs, err := tokenPairs(getenv)
	if err != nil {
		return err
	}
	tokens := strings.NewReplacer(pairs...)
	// fill pins the images, and puts the tokens into Secret documents only: a
	// token in a WasmPlugin, an EnvoyExtensionPolicy or a ConfigMap is readable
	// by whoever reads those.
	fill := func(f, file string) (string, error) {
		parts := strings.Split(images.Replace(file), "\n---\n")
		for i, doc := range parts {
			if secretKind.MatchString(doc) {
				parts[i] = tokens.Replace(doc)
				continue
			}
			for _, line := range strings.Split(doc, "\n") {
				if t := strings.TrimSpace(line); !strings.HasPrefix(t, "#") && strings.Contains(t, "change-me-") {
					return "", fmt.Errorf("%s: a token placeholder outside a Secret: %s", f, t)
				}
			}
		}
		return strings.Join(parts, "\n---\n"), nil
	}
	for _, sub := range []string{"kubernetes", "istio", "gateway", "contour"} {
		files, err := filepath.Glob(filepath.Join(src, sub, "*.yaml"))
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(dest, sub), 0o755); err != nil {
			return err
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			doc, err := fill(f, string(b))
			if err != nil {
				return err
			}
			doc = generated(filepath.ToSlash(filepath.Join("envoy", sub, filepath.Base(f))), repo, filepath.ToSlash(dest), doc)
			// The comments' example commands may name the placeholder registry; a
			// value may not.
			for _, line := range strings.Split(doc, "\n") {
				if t := strings.TrimSpace(line); !strings.HasPrefix(t, "#") && strings.Contains(t, placeholder) {
					return fmt.Errorf("%s: a digest placeholder is left: %s", f, t)
				}
			}
			to := filepath.Join(dest, sub, filepath.Base(f))
			if err := os.WriteFile(to, []byte(doc), 0o600); err != nil {
				return err
			}
			fmt.Fprintln(stdout, to)
		}
	}
	return nil
}

// generated returns doc, the filled-in file src, as written to dest: a
// header saying where it came from, and without the template's own instructions
// for filling it in (its comment lines that begin "#~": the references to put
// in, which are pinned now).
//
// Comments that name a file of these templates (envoy/kubernetes/…,
// envoy/istio/…, envoy/gateway/…) name its generated copy under dest instead.
func generated(src, repo, dest, doc string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by make manifests from %s: images pinned by digest under %s,\n", src, repo)
	b.WriteString("# the proxies' tokens in their Secret. Regenerate it rather than edit it.\n#\n")
	paths := strings.NewReplacer("envoy/kubernetes/", dest+"/kubernetes/", "envoy/istio/", dest+"/istio/", "envoy/gateway/", dest+"/gateway/")
	for _, line := range strings.SplitAfter(doc, "\n") {
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(t, "#~"):
		case strings.HasPrefix(t, "#"):
			b.WriteString(paths.Replace(line))
		default:
			b.WriteString(line)
		}
	}
	return b.String()
}

// tokenPairs reads the proxies' tokens from SLUICE_READ_TOKEN and
// SLUICE_QUOTA_TOKEN and returns the placeholder, token pairs to fill the
// Secrets with. It refuses, naming each variable and echoing no token's value,
// a token unset, a placeholder or shorter than minTokenChars, and a quota token
// equal to the read token or to SLUICE_ADMIN_TOKEN (the control plane refuses
// to start with one).
func tokenPairs(getenv func(string) string) ([]string, error) {
	var pairs []string
	var bad []error
	for _, t := range []struct{ env, placeholder string }{{"SLUICE_READ_TOKEN", "change-me-read-token"}, {"SLUICE_QUOTA_TOKEN", "change-me-quota-token"}} {
		v := getenv(t.env)
		switch {
		case v == "":
			bad = append(bad, fmt.Errorf("%s is not set: the Secret would keep the placeholder %s", t.env, t.placeholder))
		case strings.HasPrefix(v, "change-me"):
			bad = append(bad, fmt.Errorf("%s is a placeholder (it begins with change-me)", t.env))
		case len(v) < minTokenChars:
			bad = append(bad, fmt.Errorf("%s has %d characters: use at least %d", t.env, len(v), minTokenChars))
		default:
			pairs = append(pairs, t.placeholder, v)
		}
	}
	// The control plane refuses to start with a quota token equal to its admin
	// or read token (config.Validate): say so now, not as a CrashLoopBackOff.
	if q := getenv("SLUICE_QUOTA_TOKEN"); q != "" {
		if q == getenv("SLUICE_READ_TOKEN") {
			bad = append(bad, errors.New("SLUICE_QUOTA_TOKEN equals SLUICE_READ_TOKEN: the control plane refuses a quota token equal to its read or admin token"))
		}
		if q == getenv("SLUICE_ADMIN_TOKEN") {
			bad = append(bad, errors.New("SLUICE_QUOTA_TOKEN equals SLUICE_ADMIN_TOKEN: the control plane refuses a quota token equal to its read or admin token"))
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w\n(the proxies' tokens must be those of the control plane's Secret sluice-tokens; openssl rand -hex 32 makes one)", errors.Join(bad...))
	}
	return pairs, nil
}
