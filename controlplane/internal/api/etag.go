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
// unparseable member makes ok false.
func parseCondition(h http.Header, name string) (c condition, ok bool) {
	values := h.Values(name)
	if len(values) == 0 {
		return c, true
	}
	c.present = true
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			part = strings.TrimSpace(part)
			switch {
			case part == "":
				continue
			case part == "*":
				c.any = true
				continue
			}
			weak := strings.HasPrefix(part, "W/")
			part = strings.TrimPrefix(part, "W/")
			if len(part) < 2 || part[0] != '"' || part[len(part)-1] != '"' || strings.Contains(part[1:len(part)-1], `"`) {
				return c, false
			}
			c.tags = append(c.tags, part)
			c.weak = append(c.weak, weak)
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
