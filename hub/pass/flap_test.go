package pass

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/health/report"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/assess/assesstest"
	"github.com/hale-dev/hale/quorum"
)

// Three members and two witnesses on a starved machine, through the real assessor and pass, pass after
// pass (every 500 ms): members freeze and resume at random; reports are late or lost, now and then all
// of them for a stretch; an observer's probe of a member that runs times out now and then, and so does
// a member's own probe, so that etcd's quorum is seen lost and back again and again, as on test/lab's
// loaded machine. At every pass an operator asks to reboot each member that runs, and the pass begins
// what it begins. Whatever is admitted or begun must leave a quorum of the voters that truly run,
// unless the hub could not know better (a strict majority of the observers' latest reports were sent
// before the member concerned last froze or resumed); and the pass begins only on a member frozen past
// its stall tolerance, the shorter one only once quorum has been lost, or the latest reports have said
// so, for that long without a break. Each fails within the first four seeds on what it was written
// for: a frozen member counted healthy right after quorum came back, on its own last report (seed 0)
// or on older views that reached it (seed 3), and an operator's reboot of another admitted; a loss seen
// again within 10 s of its return taken for the same loss, and a member frozen 11 s power-cycled on
// the shorter wait while the others only blipped (seed 0).
func TestNoDisruptionCostsQuorumThroughFlapsRandomized(t *testing.T) {
	seeds, passes := 100, 300
	if testing.Short() {
		seeds = 30
	}
	const tick = 500 * time.Millisecond
	nodes := []string{"cp-0", "cp-1", "cp-2", "w-0", "w-1"}
	checked := map[string]int{}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 61))
		t0 := newScene().f.Now
		frozenAt := make([]time.Time, 3) // zero: it runs
		changed := make([]time.Time, 3)  // when it last froze or resumed
		reports := map[string]report.Report{}
		failingSince := map[string]time.Time{}
		var lossyFrom time.Time // since when quorum has been lost, or some latest report has said it was, without a break
		a := assesstest.Hearing(assess.DefaultPolicy())
		st := NewState()
		var back, starvedTo time.Time
		for n := range passes {
			now := t0.Add(time.Duration(n) * tick)
			where := fmt.Sprintf("seed %d at %v", seed, now.Sub(t0))
			for i := range frozenAt {
				switch {
				case frozenAt[i].IsZero() && rng.IntN(40) == 0:
					frozenAt[i], changed[i] = now, now
				case !frozenAt[i].IsZero() && rng.IntN(20) == 0:
					frozenAt[i], changed[i] = time.Time{}, now
				}
			}
			runs := func(i int, at time.Time) bool { return frozenAt[i].IsZero() || at.Before(frozenAt[i]) }
			running := 0
			for i := range frozenAt {
				if runs(i, now) {
					running++
				}
			}
			if !now.Before(starvedTo) && rng.IntN(50) == 0 {
				starvedTo = now.Add(time.Duration(1+rng.IntN(8)) * time.Second)
			}
			s := newSceneAt(now).witnesses("w-0", "w-1")
			for k, node := range nodes {
				if k < 3 && !runs(k, now) || now.Before(starvedTo) || rng.IntN(3) == 0 {
					continue // frozen, starved or late: its last report stands
				}
				r := s.w.Obs.Reports[node] // the world's, every member reached: made true below
				r.Version, r.SentAt, r.Started = reports[node].Version+1, now, t0
				view := *r.Etcd
				view.Members = nil
				for i, m := range assesstest.Machines() {
					yes := runs(i, now) && rng.IntN(10) != 0 // a probe that times out under load
					view.Members = append(view.Members, report.EtcdMember{Name: m.Member, Reachable: &yes})
				}
				r.Etcd = &view
				if k < 3 {
					view.LocalID, view.ClusterID = "id-"+node, "c1"
					ok := running >= 2 && rng.IntN(15) != 0
					if ok {
						delete(failingSince, node)
					} else if _, was := failingSince[node]; !was {
						failingSince[node] = now
					}
					r.Probes = []report.ProbeResult{{Name: "kubelet", OK: true, Since: t0}, {Name: "etcd", OK: ok, Since: failingSince[node], Detail: "etcdserver: no leader"}}
				}
				for p := range r.Peers {
					if i := nodeIndex(r.Peers[p].Name); i >= 0 && !runs(i, now.Add(-time.Second)) {
						r.Peers[p] = report.PeerView{Name: r.Peers[p].Name, State: report.PeerDead, Since: frozenAt[i].Add(time.Second)}
					}
				}
				reports[node] = r
			}
			lossy := running < 2 // or a running agent's latest report says a member that runs fails (a timeout, or from before it ran)
			for k, node := range nodes {
				r, ok := reports[node]
				lossy = lossy || ok && (k >= 3 || runs(k, now)) && saysOneFails(r, func(i int) bool { return runs(i, now) })
			}
			if !lossy {
				lossyFrom = time.Time{}
			} else if lossyFrom.IsZero() {
				lossyFrom = now
			}
			for node, r := range reports {
				s.w.Obs.Reports[node] = r
			}
			for i, node := range nodes {
				if i < 3 && !runs(i, now.Add(-time.Second)) {
					s.w.Obs.HubPeers[node] = report.PeerView{Name: node, State: report.PeerDead, Since: frozenAt[i].Add(time.Second)}
				}
				if _, ok := reports[node]; !ok {
					delete(s.w.Obs.Reports, node) // nothing heard from it yet
				}
			}
			inv := s.f.Inventory
			var hearing assess.Hearing
			s.f.Assessments, hearing = a.Judge(assess.Round{Policy: inv.Policy.Assess, Machines: inv.Refs(), Witnesses: inv.Witnesses, Obs: s.w.Obs, QuorumBack: back})
			f := s.stepFacts()
			heard := f.Hearing // from the gossip as it is, as the hub's live membership hears it (Hub.live)
			f.Hearing = hearing
			var rd Ready
			st, rd = Compute(st, f)
			back = rd.QuorumBack
			// costsQuorum says whether disrupting machine i leaves fewer running voters than quorum
			// needs, when the hub could have known it: not while most of the latest reports are from
			// before the last freeze or resume of i or of a frozen member.
			unknowable := func(j int) bool { return sentBefore(reports, nodes, changed[j].Add(tick)) }
			costsQuorum := func(i int) bool {
				if !runs(i, now) || unknowable(i) {
					return false // acting on a member that is down costs nothing
				}
				left, excused := 0, false
				for j := range frozenAt {
					switch {
					case j == i:
					case runs(j, now):
						left++
					case unknowable(j):
						excused = true
					}
				}
				return left < 2 && !excused
			}
			for _, b := range rd.Begin {
				i := nodeIndex(b.Machine.Node)
				require.False(t, costsQuorum(i), "%s: the pass began %s on %s: %s", where, b.Remediation.Reason, b.Machine.Name, said(rd))
				// And never on a machine that runs, nor one frozen for less than its stall tolerance: the
				// shorter one only once quorum has been lost, or the latest reports have said something
				// false (the hub sees what they say), for that long without a break: blips a few
				// seconds apart are no lasting loss.
				tol := f.Inventory.Policy.StallTolerance.Held
				if !lossyFrom.IsZero() && now.Sub(lossyFrom) >= f.Inventory.Policy.StallTolerance.Needed {
					tol = f.Inventory.Policy.StallTolerance.Needed
				}
				require.True(t, !runs(i, now) && now.Sub(frozenAt[i]) >= tol, "%s: the pass began %s on %s, frozen since %v (tolerance %v): %s %+v", where,
					b.Remediation.Reason, b.Machine.Name, frozenAt[i], tol, said(rd), f.Assessments)
				checked["begun"]++
			}
			live, why := MembershipOf(inv, s.w.Obs, f.Assessments, heard, nil)
			b := Beside{Live: live}
			if why != "" {
				b.LiveErr = fmt.Errorf("%s", why)
			}
			for i, m := range f.Inventory.Machines {
				if !runs(i, now) {
					continue
				}
				_, err := AdmitOperator(f, m, OperatorRequest{Strategy: quorum.Reboot}, b)
				if err == nil {
					require.False(t, costsQuorum(i), "%s: an operator's reboot of %s admitted with %v frozen; the hub's view: %+v; %v", where, m.Name, frozenAt,
						live.Members, f.Assessments)
					checked["admitted"]++
				} else {
					checked["refused"]++
				}
			}
		}
	}
	t.Logf("%d seeds of %d passes: %v", seeds, passes, checked)
}

// saysOneFails says whether report r says that a member fails: its own etcd probe, or a member it does
// not reach although it runs.
func saysOneFails(r report.Report, runs func(int) bool) bool {
	for _, p := range r.Probes {
		if p.Name == "etcd" && !p.OK {
			return true
		}
	}
	for i, m := range r.Etcd.Members {
		if !*m.Reachable && runs(i) {
			return true
		}
	}
	return false
}

// nodeIndex is the index of a member's node among assesstest.Machines (-1: a witness).
func nodeIndex(node string) int {
	for i, m := range assesstest.Machines() {
		if m.Node == node {
			return i
		}
	}
	return -1
}

// sentBefore says whether a strict majority of the observers (a member's own agent among them, as the
// hub counts them) last reported before at: what they say is from before a member froze or resumed
// then, and the hub cannot know it yet (a disruptive step waits for newer reports first: the hub's
// freshBarrier).
func sentBefore(reports map[string]report.Report, nodes []string, at time.Time) bool {
	before := 0
	for _, node := range nodes {
		if r, ok := reports[node]; ok && r.SentAt.Before(at) {
			before++
		}
	}
	return 2*before > len(nodes)
}
