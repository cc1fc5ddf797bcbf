package api

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/sluice-proxy/sluice/controlplane/internal/store"
)

// etag is the strong entity tag (RFC 9110 §8.8.3) of a record:
// "v<version>.<epoch>.<sum>", e.g. "v7.3f9c0e7a2b4d6c80.5d41402abc4b2a76".
// The version orders documents within one epoch; the epoch changes when
// the store lost writes (store "Epochs"), and the sum (store.Sum) of the
// document makes the tags of two different documents differ even if a
// store handed out one version twice without anyone noticing. Clients may
// read the version and epoch out of it (openapi.yaml, "Entity tags").
func etag(r store.Record) string {
	return `"v` + strconv.FormatUint(r.Version, 10) + "." + r.Epoch + "." + r.DocSum() + `"`
}

// parseTag splits an opaque tag of ours (quotes included, W/ removed) into
// version and epoch; ok is false for other tags. The control plane's tags
// before epochs ("v7") parse with an empty epoch.
func parseTag(tag string) (version uint64, epoch string, ok bool) {
	if len(tag) < 2 || tag[0] != '"' || tag[len(tag)-1] != '"' {
		return 0, "", false
	}
	opaque, found := strings.CutPrefix(tag[1:len(tag)-1], "v")
	if !found {
		return 0, "", false
	}
	v, rest, _ := strings.Cut(opaque, ".")
	epoch, _, _ = strings.Cut(rest, ".")
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, "", false
	}
	return n, epoch, true
}

// condition is a parsed If-Match or If-None-Match field (RFC 9110 §13.1.1-2).
type condition struct {
	present bool
	any     bool     // "*"
	tags    []string // opaque tags with quotes, W/ prefix removed when weak
	weak    []bool
}

// parseCondition parses a comma-separated list of entity tags or "*". An
// unparseable member makes ok false. An opaque tag may itself hold commas
// (RFC 9110 §8.8.3: etagc), so the list is scanned tag by tag.
func parseCondition(h http.Header, name string) (c condition, ok bool) {
	values := h.Values(name)
	if len(values) == 0 {
		return c, true
	}
	c.present = true
	for _, v := range values {
		for v = strings.TrimLeft(v, " \t,"); v != ""; v = strings.TrimLeft(v, " \t,") {
			if v[0] == '*' {
				c.any = true
				v = v[1:]
			} else {
				weak := strings.HasPrefix(v, "W/")
				v = strings.TrimPrefix(v, "W/")
				if v == "" || v[0] != '"' {
					return c, false
				}
				end := strings.IndexByte(v[1:], '"')
				if end < 0 {
					return c, false
				}
				c.tags = append(c.tags, v[:end+2])
				c.weak = append(c.weak, weak)
				v = v[end+2:]
			}
			// A member ends at a comma or the end of the field.
			if v = strings.TrimLeft(v, " \t"); v != "" && v[0] != ',' {
				return c, false
			}
		}
	}
	if !c.any && len(c.tags) == 0 {
		return c, false
	}
	return c, true
}

// matchStrong is If-Match's test (§13.1.1: strong comparison).
func (c condition) matchStrong(rec store.Record) bool {
	if !rec.Exists() {
		return false
	}
	if c.any {
		return true
	}
	t := etag(rec)
	for i, tag := range c.tags {
		if !c.weak[i] && tag == t {
			return true
		}
	}
	return false
}

// matchWeak is If-None-Match's test (§13.1.2: weak comparison).
func (c condition) matchWeak(rec store.Record) bool {
	if !rec.Exists() {
		return false
	}
	if c.any {
		return true
	}
	t := etag(rec)
	for _, tag := range c.tags {
		if tag == t {
			return true
		}
	}
	return false
}

// namesOther reports whether one of the tags names a document of ours that
// rec (a tombstone) replaced: an older version of rec's epoch, or any
// version of another epoch (a history the store lost), weak or strong.
func (c condition) namesOther(rec store.Record) bool {
	for _, tag := range c.tags {
		if v, epoch, ok := parseTag(tag); ok && (epoch != rec.Epoch || v < rec.Version) {
			return true
		}
	}
	return false
}
