package rules

import (
	"archive/zip"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSlimZonesTellTheTimeAsTheFullDatabase: the embedded zones are exactly the
// zones of Go's time zone database (GOROOT/lib/time/zoneinfo.zip, which
// time/tzdata embeds; read from there, not through time.LoadLocation, which
// prefers the system's database), and each tells the same offset, abbreviation and local
// midnight as the full zone at two instants of every day from the cutoff to the
// end of 2040. When Go's database changes, this fails until the slim zones are
// generated again (go generate ./shared/rules).
func TestSlimZonesTellTheTimeAsTheFullDatabase(t *testing.T) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Skipf("go env GOROOT: %v", err)
	}
	z, err := zip.OpenReader(filepath.Join(strings.TrimSpace(string(out)), "lib", "time", "zoneinfo.zip"))
	if err != nil {
		t.Fatalf("Go's zone list: %v", err)
	}
	defer z.Close()
	var names []string
	fullData := map[string][]byte{}
	for _, f := range z.File {
		if strings.HasSuffix(f.Name, "/") {
			continue
		}
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, f.Name)
		fullData[f.Name] = b
	}
	embedded := map[string]bool{}
	for _, n := range zoneNames {
		embedded[n] = true
	}
	for _, n := range names {
		if !embedded[n] {
			t.Errorf("zone %s of Go's database is not embedded (go generate ./shared/rules)", n)
		}
		delete(embedded, n)
	}
	for n := range embedded {
		t.Errorf("embedded zone %s is not in Go's database (go generate ./shared/rules)", n)
	}

	end := time.Date(2041, 1, 1, 0, 0, 0, 0, time.UTC)
	if testing.Short() {
		end = time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	days := 0
	for _, name := range names {
		full, err := time.LoadLocationFromTZData(name, fullData[name])
		if err != nil {
			t.Fatalf("%s: full: %v", name, err)
		}
		slim, err := LoadZone(name)
		if err != nil {
			t.Fatalf("%s: slim: %v", name, err)
		}
		bad := 0
		for d := time.Unix(zoneCutoff, 0).UTC(); d.Before(end) && bad < 3; d = d.AddDate(0, 0, 1) {
			for _, at := range []time.Time{d, d.Add(12*time.Hour + 30*time.Minute)} {
				fn, fo := at.In(full).Zone()
				sn, so := at.In(slim).Zone()
				if fn != sn || fo != so {
					t.Errorf("%s at %s: slim %s %+d s, full %s %+d s", name, at.Format(time.RFC3339), sn, so, fn, fo)
					bad++
				}
			}
			y, m, dd := d.Date()
			if f, s := time.Date(y, m, dd, 0, 0, 0, 0, full), time.Date(y, m, dd, 0, 0, 0, 0, slim); !f.Equal(s) {
				t.Errorf("%s: local midnight of %s: slim %s, full %s", name, d.Format(time.DateOnly), s.UTC(), f.UTC())
				bad++
			}
			days++
		}
	}
	t.Logf("%d zones, %d zone-days compared", len(names), days)
}

// TestLoadZoneRefuses: names the database does not have, "" and "Local".
func TestLoadZoneRefuses(t *testing.T) {
	for _, name := range []string{"", "Local", "Europe/Atlantis", "europe/berlin", "Europe/Berlin/", "../UTC"} {
		if loc, err := LoadZone(name); err == nil {
			t.Errorf("LoadZone(%q) = %v, want an error", name, loc)
		}
	}
	for _, name := range []string{"UTC", "Europe/Berlin", "America/Sao_Paulo", "Africa/Casablanca", "Etc/GMT+5"} {
		if _, err := LoadZone(name); err != nil {
			t.Errorf("LoadZone(%q): %v", name, err)
		}
	}
}
