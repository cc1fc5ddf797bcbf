package fleettorture

import (
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/testenv/testkit/proctest"
)

// span is a time interval, Unix ns.
type span struct{ from, to int64 }

func (s span) touches(w int64) bool {
	return s.from < (w+1)*int64(window) && s.to >= w*int64(window)
}

// scenario is one run of the load with at most one fault.
type scenario struct {
	name string
	// pressure is how many more quota clients ask for the loose rule's hot key
	// in a tight loop, straight to the replicas, all through the scenario: a
	// hot key's contention, which must cost no false 429.
	pressure int
	// fault injects the fault and undoes it (or not: a dead proxy stays dead),
	// returning when it is over, and the interval in which Redis held no data
	// (zero when it did not lose any).
	fault func(s *stack) (lost span)
}

// window's counts.
type tally struct {
	tightAdmitted, tightAmbiguous, tight429, tightDegraded int
	loose429, looseAmbiguous429, other                     int
}

// run runs sc on s: the load for one window to warm up, one clean window, the
// fault, recovery, and two more windows; it checks every whole window and logs
// a table.
func (s *stack) run(sc scenario, rate int) {
	t := s.t
	if sc.pressure > 0 {
		defer s.press(sc.pressure)()
	}
	l := s.startLoad(rate)
	first := awaitWindowStart() + 1 // the window the load warmed up in is not counted
	time.Sleep(time.Until(time.Unix(0, (first+1)*int64(window))))
	var faulty, lost span
	if sc.fault != nil {
		faulty.from = time.Now().UnixNano()
		lost = sc.fault(s)
		faulty.to = s.awaitRecovered(l, time.Now().UnixNano(), 60*time.Second)
	}
	last := windowOf(time.Now().UnixNano()) + 2
	time.Sleep(time.Until(time.Unix(0, (last+1)*int64(window))))
	results := l.stop()

	counts := map[int64]*tally{}
	get := func(w int64) *tally {
		if counts[w] == nil {
			counts[w] = &tally{}
		}
		return counts[w]
	}
	var straddling []span // admitted tight requests sent in one window, answered in a later one: [first, last] window
	for _, r := range results {
		ws, wr := windowOf(r.sent), windowOf(r.recv)
		if r.status == 0 {
			continue // the Envoy was killed under it
		}
		if r.tight && r.status == 200 && ws != wr {
			straddling = append(straddling, span{ws, wr})
		}
		for w := ws; w <= wr; w++ {
			c := get(w)
			sure := ws == wr
			switch {
			case r.tight && r.status == 200 && sure:
				c.tightAdmitted++
			case r.tight && r.status == 200:
				c.tightAmbiguous++
			case r.tight && r.status == 429 && sure:
				c.tight429++
				if r.degraded {
					c.tightDegraded++
				}
			case !r.tight && r.status == 429 && sure:
				c.loose429++
			case !r.tight && r.status == 429:
				c.looseAmbiguous429++
			case r.status != 200 && r.status != 429:
				c.other++
			}
		}
	}
	boundOf := func(w int64) int {
		if lost.to != 0 && lost.touches(w) {
			return 2 * limit // the counter restarted from zero in this window
		}
		return limit
	}
	// A straddling request was decided in exactly one of its windows: place each
	// in the earliest window with room (by last window first), so that a window
	// is over its bound only when no placement keeps it within.
	sort.Slice(straddling, func(i, j int) bool { return straddling[i].to < straddling[j].to })
	placed := map[int64]int{}
	for _, sp := range straddling {
		w := sp.to
		for c := sp.from; c <= sp.to; c++ {
			if get(c).tightAdmitted+placed[c] < boundOf(c) {
				w = c
				break
			}
		}
		placed[w]++
	}
	var b strings.Builder
	b.WriteString("\n" + sc.name + ": window  tight admitted (+straddling)  tight 429 (degraded)  loose 429  other  L  verdict\n")
	for w := first; w <= last; w++ {
		c := get(w)
		fault := sc.fault != nil && faulty.touches(w)
		bound := boundOf(w)
		var bad []string
		if up := c.tightAdmitted + placed[w]; up > bound {
			bad = append(bad, "over-admitted "+strconv.Itoa(up)+" > "+strconv.Itoa(bound))
		}
		if !fault {
			// Under-admission is judged only where demand stays well above the
			// limit to the window's end (at least half the limit again was
			// refused). Leases are sized for each Envoy's recent rate; where
			// demand barely exceeds the limit (a machine slowed by the pressing
			// clients sends less than the nominal rate), units leased in the last
			// moments can expire unspent in an Envoy that receives no further
			// request in the window. That is the lease design's cost, not a false
			// denial of budget the service still had.
			// An answer delayed to a window's last moments strands its units the
			// same way (granted out of this window's budget, it reaches its Envoy
			// after the window ended): up to 2 % of the limit is allowed for that,
			// and 5 % while the pressing clients keep both cores saturated on
			// purpose, which delays every answer (CI saw 6 and 7 of 300 there,
			// with nothing else running).
			short := limit / 50
			if sc.pressure > 0 {
				short = limit / 20
			}
			if up := c.tightAdmitted + c.tightAmbiguous; up < limit-short && c.tight429 >= limit/2 {
				bad = append(bad, "under-admitted "+strconv.Itoa(up)+" < "+strconv.Itoa(limit)+" with demand above it")
			}
			if c.loose429 > 0 {
				bad = append(bad, strconv.Itoa(c.loose429)+" false 429 on a budget of 10^8")
			}
			if c.other > 0 {
				bad = append(bad, strconv.Itoa(c.other)+" answers neither 200 nor 429")
			}
		}
		verdict := "ok"
		if len(bad) > 0 {
			verdict = strings.Join(bad, "; ")
			t.Errorf("%s, window %d: %s", sc.name, w-first, verdict)
		}
		kind := "      "
		if fault {
			kind = "fault "
		}
		b.WriteString("  " + kind + strconv.FormatInt(w-first, 10) + "  " + strconv.Itoa(c.tightAdmitted) + " (+" + strconv.Itoa(c.tightAmbiguous) + ")  " +
			strconv.Itoa(c.tight429) + " (" + strconv.Itoa(c.tightDegraded) + ")  " + strconv.Itoa(c.loose429) + "  " + strconv.Itoa(c.other) +
			"  " + strconv.Itoa(bound) + "  " + verdict + "\n")
	}
	t.Log(b.String())
}

// rate is the requests per second the load sends to each rule, in all: about
// twice what rule tight admits.
const rate = 2 * limit * int(time.Second) / int(window)

var (
	killReplica = scenario{name: "control-plane replica killed and restarted", fault: func(s *stack) span {
		s.cps[1].Kill()
		time.Sleep(window) // down for a window: the fault's length, not a wait for an event
		s.cps[1].Start()
		proctest.AwaitHTTP(s.t, "http://"+s.cpAddrs[1]+"/readyz", 20*time.Second, s.cps[1])
		return span{}
	}}
	freezeRedis = scenario{name: "Redis frozen 5 s (SIGSTOP)", fault: func(s *stack) span {
		if err := s.redis.Signal(syscall.SIGSTOP); err != nil {
			s.t.Fatal(err)
		}
		time.Sleep(5 * time.Second) // the fault's length, not a wait for an event
		if err := s.redis.Signal(syscall.SIGCONT); err != nil {
			s.t.Fatal(err)
		}
		return span{}
	}}
	restartRedisEmpty = scenario{name: "Redis killed and restarted empty", fault: func(s *stack) span {
		from := time.Now().UnixNano()
		s.redis.Restart() // SIGKILL, then a new server on the same port with no data
		return span{from: from, to: time.Now().UnixNano()}
	}}
	killProxy = scenario{name: "dev proxy holding leases killed (kill -9)", fault: func(s *stack) span {
		e := s.envoys[2]
		e.dead.Store(true)
		e.kill()
		return span{}
	}}
)

// TestFleetHoldsUnderFaults: 3 dev proxies and 8 in-process Envoys on two
// replicas over one redis-server, through each fault in turn.
func TestFleetHoldsUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("the torture test runs for about two minutes")
	}
	s := startStack(t, 8, false)
	for _, sc := range []scenario{{name: "no fault"}, killReplica, freezeRedis, restartRedisEmpty, killProxy} {
		s.run(sc, rate)
	}
}

// TestFleetHoldsWithManyEnvoys: 3 dev proxies and 32 in-process Envoys (128 with
// SLUICE_TORTURE_BIG=1) on one hot key: no fault, then 64 more quota clients
// pressing on the loose rule's key, then a replica killed.
func TestFleetHoldsWithManyEnvoys(t *testing.T) {
	if testing.Short() {
		t.Skip("the torture test runs for about a minute")
	}
	n := 32
	if os.Getenv("SLUICE_TORTURE_BIG") == "1" {
		n = 128
	}
	s := startStack(t, n, false)
	for _, sc := range []scenario{{name: "no fault, " + strconv.Itoa(n+3) + " Envoys"},
		{name: "no fault, hot key pressed by 64 more quota clients", pressure: 64}, killReplica} {
		s.run(sc, rate)
	}
}

// TestFleetHoldsOnACluster: the same fleet on a three-node Redis Cluster.
func TestFleetHoldsOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("the torture test runs for about a minute")
	}
	s := startStack(t, 8, true)
	s.run(scenario{name: "no fault, Redis Cluster"}, rate)
}
