package rules

import (
	"errors"
	"sort"
	"time"
)

//go:generate go run gen_zones.go

// LoadZone returns the IANA time zone name ("Europe/Berlin", "UTC") from the time
// zone database embedded in this package, which a wasm guest needs (it has no
// /usr/share/zoneinfo). The database is Go's (the one package time/tzdata embeds),
// each zone cut down to the rules in force from 2025 on: the returned Location tells
// every instant from then on exactly as the full database does, and earlier ones
// possibly not (the package's tests compare the two, zone by zone and day by day).
// The error is non-nil for a name the database does not know, "" and "Local".
func LoadZone(name string) (*time.Location, error) {
	i := sort.SearchStrings(zoneNames[:], name)
	if name == "" || i == len(zoneNames) || zoneNames[i] != name {
		return nil, errors.New("rules: unknown time zone " + quoteClipped(name))
	}
	s := zoneSpans[i]
	return time.LoadLocationFromTZData(name, []byte(zoneData[s[0]:s[1]]))
}
