package health

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hale-dev/hale/health/identity"
)

// BenchmarkFailureDetection hard-kills one of 5 members (no leave message) and measures how long
// until every survivor has declared it dead, for Hale's DefaultTiming (30 trials) and memberlist's
// DefaultLANConfig (12: two rounds of six pools; the comparison is its p50 and max, seconds above
// Hale's) side by side; HALE_TRIALS sets both. Target: Hale p99 ≤ 1 s.
// Run it with -benchtime 1x: each timing is one b.N iteration of all the trials.
//
// Hale's trials run one at a time: its 100 ms probing is what a busy CPU would slow. memberlist's
// // run six pools side by side (its probes are a second apart, its detection seconds of timers, not
// CPU), which takes each round of six trials from a minute to ~11 s on 2 cores.
func BenchmarkFailureDetection(b *testing.B) {
	for _, tc := range []struct {
		name             string
		timing           Timing
		trials, parallel int
	}{{"hale", DefaultTiming(), 30, 1}, {"memberlist-lan", LANTiming(), 12, 6}} {
		b.Run(tc.name, func(b *testing.B) {
			trials := int(durationFromEnv(b, "HALE_TRIALS", time.Duration(tc.trials)*time.Second) / time.Second)
			var lat []time.Duration
			for b.Loop() {
				for done := 0; done < trials; done += tc.parallel {
					lat = append(lat, detect(b, tc.timing, min(tc.parallel, trials-done))...)
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

// detect runs n trials at once, each on a pool of its own: it forms the pools, lets them settle,
// hard-kills one member of each and returns, for each pool, how long until its last survivor declared
// the victim dead (from the survivor's own record of when it did, not from when this loop looked).
func detect(b *testing.B, timing Timing, n int) []time.Duration {
	b.Helper()
	pools := make([]*pool, n)
	for i := range pools {
		pools[i] = startPool(b, 5, func(c *GossipConfig) { c.Timing = timing })
	}
	// Let the pools settle for a few probe rounds, as a running cluster would be.
	time.Sleep(3 * timing.ProbeInterval)
	killed := make([]time.Time, n)
	for i, p := range pools {
		killed[i] = time.Now()
		if err := p.members[4].Shutdown(); err != nil {
			b.Fatal(err)
		}
	}
	out := make([]time.Duration, n)
	deadline := time.Now().Add(30 * time.Second)
	for i, p := range pools {
		name := p.members[4].cfg.Node
		for _, g := range p.members[:4] {
			for {
				if pv, ok := peerView(g, name); ok && pv.State == PeerDead {
					out[i] = max(out[i], pv.Since.Sub(killed[i]))
					break
				}
				if time.Now().After(deadline) {
					// What each survivor holds of it, and whom its memberlist lists (to tell a death
					// never noticed from one noticed and undone).
					var views []string
					for _, o := range p.members[:4] {
						pv, _ := peerView(o, name)
						var listed []string
						for _, n := range o.ml.Members() {
							listed = append(listed, n.Name)
						}
						views = append(views, fmt.Sprintf("%s: %s since %s, memberlist lists %v", o.cfg.Node, pv.State, pv.Since.Format("15:04:05.000"), listed))
					}
					b.Fatalf("%s never declared %s dead (killed at %s):\n%s", g.cfg.Node, name, killed[i].Format("15:04:05.000"), strings.Join(views, "\n"))
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		for _, g := range p.members[:4] {
			_ = g.Shutdown()
		}
	}
	return out
}

func peerView(g *Gossip, name string) (PeerView, bool) {
	for _, pv := range g.Peers() {
		if pv.Name == name {
			return pv, true
		}
	}
	return PeerView{}, false
}

// BenchmarkReportSignature measures what identities cost a member: signing its report (once per
// report it publishes) and a receiver's check of a report it has not seen (once per report per member;
// relayed copies of a report already kept are dropped on their bytes before any check), on a report
// of a control-plane agent's size (five probes, a three-member etcd view, six peers).
func BenchmarkReportSignature(b *testing.B) {
	id := identity.NewIdentity()
	pinned := identity.PinnedOf(map[string][]identity.PublicKey{"cp-1": {id.Public()}})
	r := Report{Node: "cp-1", Cluster: "prod", Version: 1, SentAt: time.Now(), Etcd: &EtcdView{LeaderID: "8e9e05c52164694d", RaftIndex: 123456}}
	for _, p := range []string{"kubelet", "apiserver", "etcd", "etcdDisk", "clock"} {
		r.Probes = append(r.Probes, ProbeResult{Name: p, OK: true, Detail: "ok: answered in 3ms", Since: time.Now(), CheckedAt: time.Now()})
	}
	yes := true
	for _, m := range []string{"etcd-0", "etcd-1", "etcd-2"} {
		r.Etcd.Members = append(r.Etcd.Members, EtcdMember{ID: "8e9e05c52164694d", Name: m, PeerURLs: []string{"https://10.0.0.1:2380"}, Reachable: &yes})
	}
	for _, p := range []string{"cp-0", "cp-2", "w-0", "w-1", "hub-a"} {
		r.Peers = append(r.Peers, PeerView{Name: p, State: PeerAlive, Since: time.Now()})
	}
	inner, err := EncodeReport(&r)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("sign", func(b *testing.B) {
		for b.Loop() {
			signReport(id, inner)
		}
		b.ReportMetric(float64(len(inner)), "report-bytes")
	})
	msg := signReport(id, inner)
	b.Run("verify", func(b *testing.B) {
		for b.Loop() {
			in, sig, _ := splitSigned(msg)
			if ok, _ := pinned.Verify("cp-1", in, sig); !ok {
				b.Fatal("does not verify")
			}
		}
	})
}
