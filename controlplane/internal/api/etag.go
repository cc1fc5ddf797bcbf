package api

import (
	"net/http"
	"strconv"
	"strings"
)

// etag is the entity tag of a version: "v7" (RFC 9110 §8.8.3, strong).
func etag(version uint64) string { return `"v` + strconv.FormatUint(version, 10) + `"` }

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
func (c condition) matchStrong(exists bool, version uint64) bool {
	if !exists {
		return false
	}
	if c.any {
		return true
	}
	t := etag(version)
	for i, tag := range c.tags {
		if !c.weak[i] && tag == t {
			return true
		}
	}
	return false
}

// matchWeak is If-None-Match's test (§13.1.2: weak comparison).
func (c condition) matchWeak(exists bool, version uint64) bool {
	if !exists {
		return false
	}
	if c.any {
		return true
	}
	t := etag(version)
	for _, tag := range c.tags {
		if tag == t {
			return true
		}
	}
	return false
}

// namesOlder reports whether one of the tags is a version of ours older than
// version ("v3" when version is 4), weak or strong.
func (c condition) namesOlder(version uint64) bool {
	for _, tag := range c.tags {
		opaque := tag[1 : len(tag)-1]
		if !strings.HasPrefix(opaque, "v") {
			continue
		}
		if n, err := strconv.ParseUint(opaque[1:], 10, 64); err == nil && n < version {
			return true
		}
	}
	return false
}
