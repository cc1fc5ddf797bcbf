package store

import (
	"encoding/json"
	"fmt"
	"time"
)

// entryJSON is how stores persist a HistoryEntry: the document stays readable
// JSON (it always is JSON) instead of base64.
type entryJSON struct {
	Version uint64          `json:"version"`
	TimeMs  int64           `json:"time_ms"`
	Actor   string          `json:"actor"`
	Op      Operation       `json:"op"`
	Detail  string          `json:"detail,omitempty"`
	Doc     json.RawMessage `json:"doc,omitempty"`
}

// MarshalEntry encodes a history entry for storage. Time is kept in
// milliseconds since the Unix epoch. Doc must be JSON or nil.
func MarshalEntry(e HistoryEntry) []byte {
	b, err := json.Marshal(entryJSON{
		Version: e.Version, TimeMs: e.Time.UnixMilli(), Actor: e.Actor, Op: e.Op,
		Detail: e.Detail, Doc: json.RawMessage(e.Doc),
	})
	if err != nil {
		// Only a non-JSON Doc can fail, which callers never pass.
		panic("store: MarshalEntry: " + err.Error())
	}
	return b
}

// UnmarshalEntry decodes what MarshalEntry produced.
func UnmarshalEntry(b []byte) (HistoryEntry, error) {
	var j entryJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return HistoryEntry{}, fmt.Errorf("store: decode history entry: %w", err)
	}
	e := HistoryEntry{
		Version: j.Version, Time: time.UnixMilli(j.TimeMs).UTC(), Actor: j.Actor, Op: j.Op,
		Detail: j.Detail,
	}
	if len(j.Doc) > 0 && string(j.Doc) != "null" {
		e.Doc = []byte(j.Doc)
	}
	return e, nil
}

// EntryOf returns the history entry a change produces once committed as
// version.
func EntryOf(c Change, version uint64) HistoryEntry {
	return HistoryEntry{Version: version, Time: c.Time, Actor: c.Actor, Op: c.Op, Detail: c.Detail, Doc: c.Doc}
}
