package hub

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/assess/assesstest"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/quorum/quorumtest"
)

// passBench is one pass's inputs at scale: n machines (the first five etcd members, the rest workers
// in pools of 500), each with a fresh report from its agent (two probes; the members' agents with
// the etcd view), one worker dead per pool (seen dead by every other agent), two witnesses.
func passBench(n int) (pass.Inventory, assess.Observations) {
	now := assesstest.T0().Add(time.Hour)
	inv := pass.Inventory{Cluster: "bench", Policy: testPolicy(), Witnesses: []string{"w-0", "w-1"}}
	obs := assess.Observations{Now: now, Reports: map[string]health.Report{}, HubPeers: map[string]health.PeerView{}}
	var members []health.EtcdMember
	for i := range 5 {
		yes := true
		members = append(members, health.EtcdMember{Name: fmt.Sprintf("etcd-%d", i), Reachable: &yes})
	}
	var dead []health.PeerView
	for i := range n {
		m := pass.Machine{MachineRef: assess.MachineRef{Name: fmt.Sprintf("m-%d", i), Node: fmt.Sprintf("n-%d", i)}, Strategy: quorum.Reboot, Pool: fmt.Sprintf("pool-%d", i/500)}
		if i < 5 {
			m.Member, m.Pool = fmt.Sprintf("etcd-%d", i), "control-plane"
		}
		inv.Machines = append(inv.Machines, m)
		if i >= 5 && i%500 == 7 {
			dead = append(dead, health.PeerView{Name: m.Node, State: health.PeerDead, Since: now.Add(-time.Minute)})
		}
	}
	isDead := map[string]bool{}
	for _, d := range dead {
		isDead[d.Name] = true
	}
	nodes := append(inv.Refs(), assess.MachineRef{Node: "w-0"}, assess.MachineRef{Node: "w-1"})
	for i, m := range nodes {
		if isDead[m.Node] {
			obs.HubPeers[m.Node] = health.PeerView{Name: m.Node, State: health.PeerDead, Since: now.Add(-time.Minute)}
			continue
		}
		obs.HubPeers[m.Node] = health.PeerView{Name: m.Node, State: health.PeerAlive, Since: assesstest.T0()}
		r := health.Report{Node: m.Node, SentAt: now, Peers: dead,
			Probes: []health.ProbeResult{{Name: "kubelet", OK: true, Since: assesstest.T0()}, {Name: "etcd", OK: true, Since: assesstest.T0()}}}
		if i < 5 || m.Node == "w-0" || m.Node == "w-1" {
			r.Etcd = &health.EtcdView{ClusterID: "c0ffee", LocalName: m.Member, Members: members, RaftTerm: 2, RaftIndex: uint64(90_000 + i)}
		}
		obs.Reports[m.Node] = r
	}
	return inv, obs
}

// BenchmarkPass5000 is a pass's pure part at 5,000 machines: assess, then step (the verdicts
// recorded, decide, what it says). The hub's loop is 200 ms; the target is 5 ms. BenchmarkPass500 is
// the same at 500: test/run fails when a machine costs more than 3 times as much at 5,000 as at 500
// (a search per machine through the inventory made the pass quadratic once: 104 ms at 5,000, unseen
// while the absolute target was only printed).
// go test -run '^$' -bench Pass500 -benchmem ./hub
func BenchmarkPass5000(b *testing.B) { benchPass(b, 5000) }

// BenchmarkPass500 is BenchmarkPass5000 at 500 machines, its baseline.
func BenchmarkPass500(b *testing.B) { benchPass(b, 500) }

func benchPass(b *testing.B, n int) {
	step := passStepper(b, n)
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/pass")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/machine")
}

// passStepper sets up BenchmarkPass5000's hub at n machines, in its steady state (the first pass says
// every verdict once), and returns one pass of it; each fails the benchmark when it does not plan.
func passStepper(b *testing.B, n int) func() {
	inv, obs := passBench(n)
	a := assesstest.Hearing(inv.Policy.Assess)
	machines := inv.Refs()
	f := pass.Facts{Now: obs.Now, Inventory: inv, Observations: obs, Flights: map[string]pass.Flight{}, Detached: map[string]pass.Brake{}, History: map[string][]pass.Past{}}
	st := pass.NewState()
	f.Assessments, f.Hearing = a.AssessHearing(machines, inv.Witnesses, obs)
	st, _ = pass.Compute(st, f)
	return func() {
		var rd pass.Ready
		f.Assessments, f.Hearing = a.AssessHearing(machines, inv.Witnesses, obs)
		st, rd = pass.Compute(st, f)
		if st.View.NotPlanning != "" || len(rd.Begin) == 0 {
			b.Fatalf("the bench does not plan: %q, %d starts", st.View.NotPlanning, len(rd.Begin))
		}
	}
}

// BenchmarkPassVsPlan is a whole hub pass at 5,000 machines (BenchmarkPass5000's) against the quorum
// planner's own pass over quorum's benchmark fleet of 5,000 (BenchmarkPlanPass's), measured in turns
// in one process: each iteration times planPasses planner passes, then one hub pass right after, and
// the benchmark reports the median of the iterations' ratios. Load from elsewhere comes in bursts of
// seconds and falls on both sides of a pair alike, a few milliseconds apart: on one machine the ratio
// read 8.9-9.9 from idle to a load of 21, where pairs of separate runs (a 0.07 s planner run, then a
// 0.6 s hub run) read from 2.8 to 20.6 beside test/run's rigs. test/run's ceiling is in
// docs/testing.md.
func BenchmarkPassVsPlan(b *testing.B) {
	const planPasses = 8 // about as long as one hub pass
	step, in := passStepper(b, 5000), quorumtest.Fleet(5000)
	var ratios []float64
	var hub, plan time.Duration
	for b.Loop() {
		t0 := time.Now()
		for range planPasses {
			if _, err := quorum.PlanPass(in); err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		step()
		t2 := time.Now()
		hub, plan = hub+t2.Sub(t1), plan+t1.Sub(t0)
		ratios = append(ratios, float64(t2.Sub(t1))*planPasses/float64(t1.Sub(t0)))
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "ratio")
	b.ReportMetric(float64(hub.Microseconds())/float64(b.N)/1000, "pass-ms")
	b.ReportMetric(float64(plan.Microseconds())/float64(b.N*planPasses)/1000, "plan-ms")
}
