package quota

import (
	"bytes"
	"strconv"
	"sync"
)

// readCache keeps, per counter key, what this service last read of it or
// wrote to it: the header and the fields a round read. A round on a key that
// no one else wrote between this service's last two rounds on it (quiet)
// decides from the cache instead of reading the key, and its write is applied
// only if the stored header is still the cached one (Backend.Swap compares
// it): every write of a key changes its header (header.writes), and an
// expired key has none, so a write made on stale state never lands. A round
// that conflicts forgets the key and reads it again; one that decides from
// the cache and would write nothing reads it too (its answer must come from
// the stored state). docs/ARCHITECTURE.md, "A key no one else writes is not
// read".
type readCache struct {
	mu   sync.Mutex
	keys map[string]*cachedKey
}

// cachedKey is what readCache knows of one key: its header and the values
// (nil: absent) of the fields a round read or wrote.
type cachedKey struct {
	header []byte
	fields []Field
	// quiet: the last read of the key found the header this service had
	// left it with, so no one else wrote it between two of its rounds.
	quiet bool
}

// field returns the cached value of the field name, and whether it is cached.
func (k *cachedKey) field(name string) ([]byte, bool) {
	for _, f := range k.fields {
		if f.Name == name {
			return f.Value, true
		}
	}
	return nil, false
}

// set changes the cached value of the field name; a field not cached stays
// so (a later round that reads it reads the key).
func (k *cachedKey) set(name string, v []byte) {
	for i := range k.fields {
		if k.fields[i].Name == name {
			k.fields[i].Value = v
			return
		}
	}
}

// maxCachedFields bounds the fields remembered of one key: those of its last
// read, and while the key is quiet those of earlier reads (the entries of
// several Envoys asking in turn).
const maxCachedFields = 16

// maxCachedKeys bounds the keys remembered (a few hundred bytes each); past
// it, one is forgotten for each key added.
const maxCachedKeys = 4096

// fill sets snap to the cached state of rd's key when the key is quiet, the
// read scans nothing and every field it names is cached; it reports whether
// it did.
func (c *readCache) fill(rd Read, snap *Snapshot) bool {
	if rd.Scan.Count > 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.keys[rd.Key]
	if k == nil || !k.quiet {
		return false
	}
	vals := make([][]byte, len(rd.Fields))
	for i, f := range rd.Fields {
		v, ok := k.field(f)
		if !ok {
			return false
		}
		vals[i] = v
	}
	*snap = Snapshot{Header: bytes.Clone(k.header), Fields: vals}
	return true
}

// loaded records what a read of rd's key found: quiet when its header is
// the one the cache held (written or read by this service last).
func (c *readCache) loaded(rd Read, snap Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.keys[rd.Key]
	quiet := k != nil && snap.Header != nil && bytes.Equal(k.header, snap.Header)
	if k == nil {
		if c.keys == nil {
			c.keys = map[string]*cachedKey{}
		}
		for other := range c.keys {
			if len(c.keys) < maxCachedKeys {
				break
			}
			delete(c.keys, other)
		}
		k = &cachedKey{}
		c.keys[rd.Key] = k
	}
	k.header, k.quiet = snap.Header, quiet
	if !quiet || len(k.fields)+len(rd.Fields) > maxCachedFields {
		k.fields = k.fields[:0]
	}
	for i, f := range rd.Fields {
		if _, ok := k.field(f); ok {
			k.set(f, snap.Fields[i])
		} else {
			k.fields = append(k.fields, Field{Name: f, Value: snap.Fields[i]})
		}
	}
}

// wrote records op, applied on the state the cache holds for its key (the
// read just recorded, or the cached one it decided from).
func (c *readCache) wrote(op Op) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.keys[op.Key]
	if k == nil {
		return
	}
	k.header = op.New
	for _, f := range op.Set {
		k.set(f.Name, f.Value)
	}
	for _, name := range op.Del {
		k.set(name, nil)
	}
	for _, d := range op.Add {
		v, ok := k.field(d.Name)
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(string(v), 10, 64)
		if n += d.By; n <= 0 {
			k.set(d.Name, nil) // removed at zero or below (Delta)
		} else {
			k.set(d.Name, strconv.AppendInt(nil, n, 10))
		}
	}
}

// forget drops key: its next round reads it.
func (c *readCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.keys, key)
}
