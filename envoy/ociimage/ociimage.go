// Package ociimage builds sluice's two release images as OCI image layouts
// (https://github.com/opencontainers/image-spec/blob/main/image-layout.md)
// and pushes them to a registry, with go-containerregistry and no Docker
// daemon:
//
//   - sluice-wasm: the filter as a Wasm image in the "compat" variant of the
//     Wasm image specification (https://github.com/solo-io/wasm/blob/master/spec/spec-compat.md):
//     one application/vnd.oci.image.layer.v1.tar+gzip layer holding
//     plugin.wasm, and the manifest annotation module.wasm.image/variant=compat.
//     Istio's pkg/wasm/imagefetcher.go and Envoy Gateway's
//     internal/wasm/imagefetcher.go both accept it; both refuse a one-layer
//     "oci" variant (they require exactly two layers), see docs/RATIONALE.md.
//   - sluice-controlplane: an image index with one image per platform, each
//     a single layer holding the static binary /sluice-controlplane, run as
//     a numeric non-root user, with no shell or other file.
//
// Builds are reproducible: every timestamp (tar entries, config created,
// history) is the given Meta.Created, entries are sorted, and gzip output
// is deterministic, so the same inputs give the same digests.
package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sluice-proxy/sluice/controlplane/version"
)

const (
	// WasmName is the Wasm image's repository name under IMAGE_REPO and its
	// layout directory under build/oci.
	WasmName = "sluice-wasm"
	// ControlPlaneName is the control plane image's repository name under
	// IMAGE_REPO and its layout directory under build/oci.
	ControlPlaneName = "sluice-controlplane"

	// WasmFile is the file name the compat variant's layer holds the module
	// under (spec-compat.md; extractWasmPluginBinary in Istio's fetcher).
	WasmFile = "plugin.wasm"
	// VariantAnnotation and VariantCompat mark a compat-variant image whose
	// layer has the OCI (not Docker) media type, as spec-compat.md requires.
	VariantAnnotation = "module.wasm.image/variant"
	// VariantCompat is VariantAnnotation's value.
	VariantCompat = "compat"

	// Entrypoint is the control plane binary's path in its image.
	Entrypoint = "/sluice-controlplane"
	// User is the control plane's numeric uid:gid (65532, the "nonroot"
	// user of distroless images); no /etc/passwd is needed for a number.
	User = "65532:65532"
	// Port is the control plane's HTTP port (API, /healthz, /readyz,
	// /metrics), set by SLUICE_LISTEN in the image's environment.
	Port = 8080
	// RateLimitCommand is the path envoyproxy/ratelimit's image runs its
	// service from, and every Deployment written for it names as its
	// command: here a symbolic link to Entrypoint, which run under that name
	// is the RateLimitService configured by envoyproxy/ratelimit's
	// environment (HTTP on 8080, gRPC on RateLimitGRPCPort, debug on
	// RateLimitDebugPort).
	RateLimitCommand = "/bin/ratelimit"
	// RateLimitGRPCPort and RateLimitDebugPort are envoyproxy/ratelimit's
	// default gRPC and debug ports (GRPC_PORT, DEBUG_PORT).
	RateLimitGRPCPort  = 8081
	RateLimitDebugPort = 6070
)

// OCI annotation and label keys (image-spec annotations.md).
const (
	labelSource   = "org.opencontainers.image.source"
	labelVersion  = "org.opencontainers.image.version"
	labelRevision = "org.opencontainers.image.revision"
	labelCreated  = "org.opencontainers.image.created"
	labelTitle    = "org.opencontainers.image.title"
	labelLicenses = "org.opencontainers.image.licenses"
	refName       = "org.opencontainers.image.ref.name"
)

// Meta is what the images say about their build.
type Meta struct {
	// Version is the release (a tag such as v0.3.1, or git describe);
	// label org.opencontainers.image.version and the layouts' ref.name.
	Version string
	// Source is the repository URL (org.opencontainers.image.source).
	Source string
	// Revision is the commit (org.opencontainers.image.revision); optional.
	Revision string
	// Created is every timestamp in the images (SOURCE_DATE_EPOCH or the
	// commit time), so that rebuilding the same commit gives the same
	// digests.
	Created time.Time
}

func (m Meta) labels(title string) map[string]string {
	l := map[string]string{
		labelTitle:    title,
		labelSource:   m.Source,
		labelVersion:  m.Version,
		labelCreated:  m.Created.UTC().Format(time.RFC3339),
		labelLicenses: version.License,
	}
	if m.Revision != "" {
		l[labelRevision] = m.Revision
	}
	return l
}

// file is one regular file of a layer, or a symbolic link to link.
type file struct {
	name string
	mode int64
	data []byte
	link string
}

// filesLayer is a gzip-compressed OCI layer holding files (sorted by name,
// owned by root, modified at mtime), built with archive/tar and
// go-containerregistry's tarball.LayerFromOpener.
func filesLayer(files []file, mtime time.Time) (v1.Layer, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, f := range files {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)),
			ModTime: mtime.UTC(), Format: tar.FormatPAX}
		if f.link != "" {
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, f.link, 0
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := w.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	tb := b.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tb)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// image is an OCI image of one layer with config cfg.
func image(layer v1.Layer, cfg v1.ConfigFile, m Meta, annotations map[string]string) (v1.Image, error) {
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	created := v1.Time{Time: m.Created.UTC()}
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
		History: v1.History{Created: created, CreatedBy: "sluice-image (make image)"}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = created
	cf.Architecture, cf.OS, cf.Variant = cfg.Architecture, cfg.OS, cfg.Variant
	cf.Config = cfg.Config
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	return mutate.Annotations(img, annotations).(v1.Image), nil
}

// Wasm is the filter module as a compat-variant Wasm image: one
// tar+gzip layer holding plugin.wasm (mode 0644), OCI media types, the
// variant annotation and the OCI labels as manifest annotations.
func Wasm(module []byte, m Meta) (v1.Image, error) {
	if len(module) < 8 || !bytes.Equal(module[:4], []byte("\x00asm")) {
		return nil, errors.New("ociimage: the Wasm module does not start with the \\0asm magic")
	}
	layer, err := filesLayer([]file{{name: WasmFile, mode: 0o644, data: module}}, m.Created)
	if err != nil {
		return nil, err
	}
	ann := m.labels(WasmName)
	ann[VariantAnnotation] = VariantCompat
	return image(layer, v1.ConfigFile{Architecture: "wasm", OS: "wasip1"}, m, ann)
}

// Binary is one platform's control plane binary.
type Binary struct {
	// Platform is the binary's OS and architecture (linux/amd64, linux/arm64).
	Platform v1.Platform
	// Data is the static (CGO_ENABLED=0) executable.
	Data []byte
}

// ControlPlane is the control plane as an OCI image index with one image
// per binary: a single layer holding /sluice-controlplane (mode 0755) and
// /bin/ratelimit (a symbolic link to it), user 65532:65532, entrypoint the
// binary, SLUICE_LISTEN=0.0.0.0:8080, ports 8080, 8081 and 6070/tcp exposed
// and the OCI labels. There is no shell, no libc and
// no other file; the binary must be static.
func ControlPlane(bins []Binary, m Meta) (v1.ImageIndex, error) {
	if len(bins) == 0 {
		return nil, errors.New("ociimage: no control plane binary")
	}
	var adds []mutate.IndexAddendum
	for _, b := range bins {
		layer, err := filesLayer([]file{{name: Entrypoint[1:], mode: 0o755, data: b.Data},
			{name: RateLimitCommand[1:], mode: 0o777, link: Entrypoint}}, m.Created)
		if err != nil {
			return nil, err
		}
		cfg := v1.ConfigFile{Architecture: b.Platform.Architecture, OS: b.Platform.OS, Variant: b.Platform.Variant,
			Config: v1.Config{
				User:       User,
				Entrypoint: []string{Entrypoint},
				Env:        []string{"SLUICE_LISTEN=0.0.0.0:" + strconv.Itoa(Port)},
				ExposedPorts: map[string]struct{}{strconv.Itoa(Port) + "/tcp": {}, strconv.Itoa(RateLimitGRPCPort) + "/tcp": {},
					strconv.Itoa(RateLimitDebugPort) + "/tcp": {}},
				WorkingDir: "/",
				Labels:     m.labels(ControlPlaneName),
			}}
		img, err := image(layer, cfg, m, m.labels(ControlPlaneName))
		if err != nil {
			return nil, err
		}
		p := b.Platform
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	return mutate.Annotations(idx, m.labels(ControlPlaneName)).(v1.ImageIndex), nil
}

// WriteLayout replaces dir with an OCI image layout holding one image or
// image index (img is a v1.Image or a v1.ImageIndex), tagged ref (its
// org.opencontainers.image.ref.name in index.json).
func WriteLayout(dir string, img any, ref string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	opt := layout.WithAnnotations(map[string]string{refName: ref})
	switch v := img.(type) {
	case v1.Image:
		return p.AppendImage(v, opt)
	case v1.ImageIndex:
		return p.AppendIndex(v, opt)
	default:
		return fmt.Errorf("ociimage: WriteLayout: %T is neither an image nor an index", img)
	}
}

// Inputs are the files Build packs.
type Inputs struct {
	// Wasm is build/sluice.wasm.
	Wasm []byte
	// ControlPlane are the control plane binaries, one per platform.
	ControlPlane []Binary
}

// Digests are the two images' digests (sha256:…): the Wasm image's
// manifest and the control plane's index.
type Digests struct {
	Wasm, ControlPlane v1.Hash
}

// Build writes the two layouts under outDir (outDir/sluice-wasm,
// outDir/sluice-controlplane) and returns their digests.
func Build(outDir string, in Inputs, m Meta) (Digests, error) {
	var d Digests
	w, err := Wasm(in.Wasm, m)
	if err != nil {
		return d, err
	}
	cp, err := ControlPlane(in.ControlPlane, m)
	if err != nil {
		return d, err
	}
	if d.Wasm, err = w.Digest(); err != nil {
		return d, err
	}
	if d.ControlPlane, err = cp.Digest(); err != nil {
		return d, err
	}
	if err := WriteLayout(filepath.Join(outDir, WasmName), w, m.Version); err != nil {
		return d, fmt.Errorf("ociimage: writing %s: %w", WasmName, err)
	}
	if err := WriteLayout(filepath.Join(outDir, ControlPlaneName), cp, m.Version); err != nil {
		return d, fmt.Errorf("ociimage: writing %s: %w", ControlPlaneName, err)
	}
	return d, nil
}
