package plugin

import "testing"

func TestLocalShareFollowsTheFleetAboveItsFloor(t *testing.T) {
	for _, c := range []struct {
		permille, envoys uint32
		want             uint64
	}{
		{0, 0, 1},       // nothing known, no floor: the whole limit
		{0, 3, 3},       // three Envoys on the key: a third each
		{250, 0, 4},     // nothing known yet: the floor, a quarter
		{250, 3, 3},     // three Envoys: a third is above the floor
		{250, 10, 4},    // ten Envoys: the floor keeps a quarter
		{300, 10, 3},    // 0.3 keeps a third (1/⌊1/0.3⌋)
		{1000, 50, 1},   // a floor of the whole limit
		{1, 5000, 1000}, // the smallest floor, 1/1000
	} {
		if got := localShare(c.permille, c.envoys); got != c.want {
			t.Errorf("localShare(%d‰, %d Envoys) = 1/%d, want 1/%d", c.permille, c.envoys, got, c.want)
		}
	}
}
