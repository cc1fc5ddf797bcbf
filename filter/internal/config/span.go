package config

// memberValue returns the bytes of the value of the idx-th member (0-based)
// of the top-level object in doc, or nil if doc does not have one. doc must
// already have been read by strictjson up to that member, so it is
// well-formed there; the scan is still defensive and never panics.
// strictjson has no raw-value accessor, and the static policy must reach
// rules.ParsePolicy as a document of its own.
func memberValue(doc []byte, idx int) []byte {
	i := skipWS(doc, 0)
	if i >= len(doc) || doc[i] != '{' {
		return nil
	}
	i++
	for n := 0; ; n++ {
		i = skipWS(doc, i)
		if i >= len(doc) || doc[i] != '"' {
			return nil
		}
		i = skipString(doc, i)
		i = skipWS(doc, i)
		if i >= len(doc) || doc[i] != ':' {
			return nil
		}
		i = skipWS(doc, i+1)
		start := i
		i = skipValue(doc, i)
		if i < 0 {
			return nil
		}
		if n == idx {
			return doc[start:i:i]
		}
		i = skipWS(doc, i)
		if i >= len(doc) || doc[i] != ',' {
			return nil
		}
		i++
	}
}

func skipWS(doc []byte, i int) int {
	for i < len(doc) && (doc[i] == ' ' || doc[i] == '\t' || doc[i] == '\n' || doc[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at doc[i] == '"',
// or len(doc) if it is unterminated.
func skipString(doc []byte, i int) int {
	for i++; i < len(doc); i++ {
		switch doc[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(doc)
}

// skipValue returns the index after the value starting at doc[i], or -1.
func skipValue(doc []byte, i int) int {
	if i >= len(doc) {
		return -1
	}
	depth := 0
	for i < len(doc) {
		switch c := doc[i]; c {
		case '"':
			i = skipString(doc, i)
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',':
			if depth == 0 {
				return i
			}
		case ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	if depth == 0 {
		return i
	}
	return -1
}
