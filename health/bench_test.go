package health

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkFailureDetection hard-kills one of 5 members (no leave message) and measures how long
// until every survivor has declared it dead, over HALE_TRIALS trials (default 30), for Hale's
// DefaultTiming and memberlist's DefaultLANConfig side by side. Target: Hale p99 ≤ 1 s.
// Run it with -benchtime 1x: each timing is one b.N iteration of all the trials.
func BenchmarkFailureDetection(b *testing.B) {
	trials := int(durationFromEnv(b, "HALE_TRIALS", 30*time.Second) / time.Second)
	for _, tc := range []struct {
		name   string
		timing Timing
	}{{"hale", DefaultTiming()}, {"memberlist-lan", LANTiming()}} {
		b.Run(tc.name, func(b *testing.B) {
			var lat []time.Duration
			for b.Loop() {
				for range trials {
					lat = append(lat, detectOnce(b, tc.timing))
				}
			}
			slices.Sort(lat)
			pct := func(p float64) float64 { return lat[int(p*float64(len(lat)-1))].Seconds() * 1000 }
			b.ReportMetric(pct(0.50), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
			b.ReportMetric(lat[len(lat)-1].Seconds()*1000, "max-ms")
			b.ReportMetric(float64(len(lat)), "trials")
		})
	}
}

func detectOnce(b *testing.B, timing Timing) time.Duration {
	b.Helper()
	p := startPool(b, 5, func(c *GossipConfig) { c.Timing = timing })
	victim := p.members[4]
	name := victim.cfg.Node
	// Let the pool settle for a few probe rounds, as a running cluster would be.
	time.Sleep(3 * timing.ProbeInterval)
	killed := time.Now()
	if err := victim.Shutdown(); err != nil {
		b.Fatal(err)
	}
	var worst time.Duration
	for _, g := range p.members[:4] {
		deadline := time.Now().Add(30 * time.Second)
		for {
			if pv, ok := peerView(g, name); ok && pv.State == PeerDead {
				worst = max(worst, pv.Since.Sub(killed))
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s never declared %s dead", g.cfg.Node, name)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for _, g := range p.members[:4] {
		_ = g.Shutdown()
	}
	return worst
}

func peerView(g *Gossip, name string) (PeerView, bool) {
	for _, pv := range g.Peers() {
		if pv.Name == name {
			return pv, true
		}
	}
	return PeerView{}, false
}
