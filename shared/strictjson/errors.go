package strictjson

import "strconv"

// Error is a problem at one place in a JSON document.
type Error struct {
	// Path is the JSON path of the value concerned, such as "rules[2].window"; "" is
	// the top-level value.
	Path string
	// Message says what is wrong, such as "must be a non-negative integer".
	Message string
	// Offset is the byte offset in the document where the problem was found.
	Offset int
	// Syntax is true when the document is malformed or over a limit, so decoding
	// stopped; false for a well-formed value of the wrong type or range.
	Syntax bool
}

// Error returns "path: message", or just the message when the path is "".
func (e *Error) Error() string {
	if e.Path == "" {
		return e.Message
	}
	return e.Path + ": " + e.Message
}

// ErrorList is several errors from one document, in document order.
type ErrorList []*Error

// Error joins the errors' messages with "; ".
func (l ErrorList) Error() string {
	var b []byte
	for i, e := range l {
		if i > 0 {
			b = append(b, "; "...)
		}
		b = append(b, e.Error()...)
	}
	return string(b)
}

// JoinPath appends a child path to a parent path: JoinPath("rules[2]", "window") is
// "rules[2].window", JoinPath("rules", "[2]") is "rules[2]", and an empty side yields
// the other.
func JoinPath(parent, child string) string {
	switch {
	case parent == "":
		return child
	case child == "":
		return parent
	case child[0] == '[':
		return parent + child
	}
	return parent + "." + child
}

// maxPathKey is how many bytes of a key a rendered path shows before eliding it, so a
// hostile key cannot blow up an error message.
const maxPathKey = 64

func renderPath(path []pathElem) string {
	if len(path) == 0 {
		return ""
	}
	var b []byte
	for _, e := range path {
		if e.index == pendingKey {
			continue
		}
		if e.index >= 0 {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(e.index), 10)
			b = append(b, ']')
			continue
		}
		k := e.key
		elided := false
		if len(k) > maxPathKey {
			k = k[:maxPathKey]
			elided = true
		}
		if isPlainKey(k) && !elided {
			if len(b) > 0 {
				b = append(b, '.')
			}
			b = append(b, k...)
			continue
		}
		b = append(b, '[')
		b = AppendString(b, k)
		if elided {
			b = b[:len(b)-1]
			b = append(b, `..."`...)
		}
		b = append(b, ']')
	}
	return string(b)
}

func isPlainKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return strconv.QuoteRune(rune(c))
	}
	return "0x" + strconv.FormatUint(uint64(c), 16)
}
