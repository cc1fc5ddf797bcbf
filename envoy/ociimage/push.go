package ociimage

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Pushed is one image pushed by Push.
type Pushed struct {
	// Name is the image's repository name (WasmName or ControlPlaneName).
	Name string
	// Tag is repo/name:tag as pushed.
	Tag name.Tag
	// Digest is the manifest's (Wasm) or index's (control plane) digest.
	Digest v1.Hash
}

// Ref is the immutable reference repo/name@sha256:… to put in manifests.
func (p Pushed) Ref() string { return p.Tag.Context().Digest(p.Digest.String()).String() }

// Push reads the two layouts Build wrote under layoutDir and pushes each
// to repo/<name>:tag (repo such as registry.example.com/sluice), with the
// credentials of authn.DefaultKeychain (the Docker config file and its
// credential helpers, as crane and docker use) unless opts carry their
// own. Errors name the image.
func Push(layoutDir, repo, tag string, opts ...remote.Option) ([]Pushed, error) {
	if repo == "" {
		return nil, errors.New("ociimage: no repository (IMAGE_REPO) given")
	}
	opts = append([]remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	var out []Pushed
	for _, n := range []string{WasmName, ControlPlaneName} {
		t, err := name.NewTag(repo + "/" + n + ":" + tag)
		if err != nil {
			return out, fmt.Errorf("ociimage: %s: image name: %w", n, err)
		}
		d, err := pushLayout(filepath.Join(layoutDir, n), t, opts)
		if err != nil {
			return out, fmt.Errorf("ociimage: pushing %s: %w", t, err)
		}
		out = append(out, Pushed{Name: n, Tag: t, Digest: d})
	}
	return out, nil
}

// pushLayout pushes the single image or index of the layout at dir.
func pushLayout(dir string, t name.Tag, opts []remote.Option) (v1.Hash, error) {
	root, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	im, err := root.IndexManifest()
	if err != nil {
		return v1.Hash{}, err
	}
	if len(im.Manifests) != 1 {
		return v1.Hash{}, fmt.Errorf("%s: %d entries in index.json, want 1", dir, len(im.Manifests))
	}
	desc := im.Manifests[0]
	switch {
	case desc.MediaType.IsIndex():
		idx, err := root.ImageIndex(desc.Digest)
		if err != nil {
			return v1.Hash{}, err
		}
		return desc.Digest, remote.WriteIndex(t, idx, opts...)
	case desc.MediaType.IsImage():
		img, err := root.Image(desc.Digest)
		if err != nil {
			return v1.Hash{}, err
		}
		return desc.Digest, remote.Write(t, img, opts...)
	default:
		return v1.Hash{}, fmt.Errorf("%s: media type %s is neither an image nor an index", dir, desc.MediaType)
	}
}
