package pass

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/health/report"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/assess/assesstest"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// scene builds the facts of one pass in the style of etcd's raft tests: a world (every observer
// heard, every member healthy) that each case edits, then decide, then what it decided.
type scene struct {
	w *assesstest.World
	f Facts
}

func newScene() *scene { return newSceneAt(assesstest.T0().Add(time.Hour)) }

// newSceneAt is newScene seen at now.
func newSceneAt(now time.Time) *scene {
	s := &scene{w: assesstest.NewWorld(now)}
	s.f = Facts{Now: now, Inventory: Inventory{Cluster: "test", Policy: DefaultPolicy()}, Flights: map[string]Flight{}, Detached: map[string]Brake{},
		healthyAt: map[string]time.Time{}, beginFailed: map[string]BeginFailure{}, History: map[string][]Past{}}
	for _, m := range assesstest.Machines() {
		s.f.Inventory.Machines = append(s.f.Inventory.Machines, Machine{MachineRef: m, Strategy: quorum.Reboot, Pool: "control-plane"})
		s.f.Assessments = append(s.f.Assessments, assess.Assessment{Machine: m.Name, Verdict: assess.VerdictHealthy, EtcdHealth: quorum.Healthy, EtcdAnswers: true,
			Alive: true, LifeAt: now})
		s.f.healthyAt[m.Name] = now.Add(-2 * time.Hour)
	}
	return s
}

// dead makes machine i dead: its agent gone, its member unreachable, its verdict Unhealthy.
func (s *scene) dead(i int) *scene {
	m := assesstest.Machines()[i]
	others := slices.Clone(s.f.Inventory.Witnesses)
	for _, o := range assesstest.Machines() {
		if o.Node != m.Node {
			others = append(others, o.Node)
		}
	}
	s.w.Dead(m.Node, s.f.Now.Add(-time.Minute), others...)
	s.f.Assessments[i] = assess.Assessment{Machine: m.Name, Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy, Since: s.f.Now.Add(-time.Minute), Dead: true}
	return s
}

// remediated adds finished remediations of machine i to its history, the last ended ago, each having
// taken a step.
func (s *scene) remediated(i int, strategy string, state journal.State, ago time.Duration, n int) *scene {
	m := assesstest.Machines()[i].Name
	for k := range n {
		at := s.f.Now.Add(-ago - time.Duration(n-1-k)*time.Minute)
		s.f.History[m] = append(s.f.History[m], Past{ID: fmt.Sprintf("%s/%d", m, k), strategy: strategy, ByHub: true, State: state,
			created: at.Add(-time.Minute), Updated: at, Acts: 1})
	}
	return s
}

// idle says machine i's remediations all ended having done nothing (no step's intent written).
func (s *scene) idle(i int) *scene {
	for k := range s.f.History[assesstest.Machines()[i].Name] {
		s.f.History[assesstest.Machines()[i].Name][k].Acts = 0
	}
	return s
}

// cycled says machine i's latest remediation power-cycled it ago, and when it was last seen.
func (s *scene) cycled(i int, ago, seenAgo time.Duration) *scene {
	m := assesstest.Machines()[i].Name
	h := s.f.History[m]
	h[len(h)-1].Cycled, h[len(h)-1].Shown = s.f.Now.Add(-ago), "On: Off then On observed after GracefulRestart"
	if s.f.seenAt == nil {
		s.f.seenAt = map[string]time.Time{}
	}
	s.f.seenAt[m] = s.f.Now.Add(-seenAgo)
	return s
}

// witnesses adds witness agents that read etcd from outside, as the demo's do.
func (s *scene) witnesses(nodes ...string) *scene {
	s.f.Inventory.Witnesses = append(s.f.Inventory.Witnesses, nodes...)
	s.w.Witness(nodes...)
	for _, n := range nodes {
		r := s.w.Obs.Reports[n]
		r.Etcd = &report.EtcdView{}
		for _, m := range assesstest.Machines() {
			yes := true
			r.Etcd.Members = append(r.Etcd.Members, report.EtcdMember{Name: m.Member, Reachable: &yes})
		}
		s.w.Obs.Reports[n] = r
	}
	return s
}

func (s *scene) decide() decision {
	s.f.Observations = s.w.Obs
	s.f.Hearing = assess.Hear(assess.ExpectedOf(s.f.Inventory.Refs(), s.f.Inventory.Witnesses), s.f.Observations, s.f.Inventory.Policy.Assess.StaleAfter)
	return decide(s.f)
}

func started(d decision) []string {
	var out []string
	for _, s := range d.begin {
		out = append(out, s.Machine.Name)
	}
	return out
}

func reasonOf(d decision, machine string) string {
	if h, ok := d.holds[machine]; ok {
		return h.Why
	}
	for _, qd := range d.outcome.Decisions {
		if qd.Machine == machine {
			return qd.Reason
		}
	}
	return ""
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name        string
		scene       func() *scene
		starts      []string
		notPlanning string
		held        string            // in the whys of the brakes' holds
		reasons     map[string]string // machine → in why it is held, or the planner's reason
		kinds       map[string]Reason // machine → its hold's one reason
		needs       map[string]OperatorNeed
	}{
		{name: "all healthy: nothing", scene: newScene},
		{name: "a dead member is rebooted", scene: func() *scene { return newScene().dead(2) }, starts: []string{"m2"}},
		{name: "the hub hears no majority: nothing planned", scene: func() *scene {
			s := newScene().dead(2)
			s.w.Cut(s.f.Now.Add(-time.Minute), "cp-0", "cp-1")
			return s
		}, notPlanning: "the hub hears 1 of 4 expected observers"},
		{name: "agents disagree on the membership: waiting", scene: func() *scene {
			s := newScene().dead(2)
			r := s.w.Obs.Reports["cp-1"]
			r.Etcd = &report.EtcdView{LocalName: "etcd-1", Members: append(r.Etcd.Members, report.EtcdMember{Name: "etcd-9"})}
			s.w.Obs.Reports["cp-1"] = r
			return s
		}, notPlanning: "agents disagree on the etcd membership (2 views, the most common held by 1)"},
		{name: "witnesses without etcd access are not asked for the membership: two agents of three are a majority", scene: func() *scene {
			s := newScene()
			s.f.Inventory.Witnesses = []string{"w-0", "w-1", "w-2"}
			s.w.Witness(s.f.Inventory.Witnesses...) // witnesses without etcd access: no view of the membership
			return s.dead(2)
		}, starts: []string{"m2"}},
		{name: "a majority of views but not of the expected judges that read etcd: waiting", scene: func() *scene {
			s := newScene().witnesses("w-0", "w-1", "w-2")
			s.w.Cut(s.f.Now, "w-1", "w-2") // unheard: nobody knows whether they read etcd
			return s.dead(2)
		}, notPlanning: "only 3 of the 6 expected agents and witnesses that read etcd report the etcd membership (4 needed)"},
		{name: "workers' agents do not judge etcd (they have no etcd access): the members' agents decide", scene: func() *scene {
			s := newScene()
			for i := range 4 { // more workers than members
				w := assess.MachineRef{Name: fmt.Sprintf("w%d", i), Node: fmt.Sprintf("worker-%d", i)}
				s.f.Inventory.Machines = append(s.f.Inventory.Machines, Machine{MachineRef: w, Strategy: quorum.Reboot, Pool: "workers"})
				s.f.Assessments = append(s.f.Assessments, assess.Assessment{Machine: w.Name, Verdict: assess.VerdictHealthy})
				s.w.Obs.HubPeers[w.Node] = report.PeerView{Name: w.Node, State: report.PeerAlive, Since: assesstest.T0()}
				s.w.Obs.Reports[w.Node] = report.Report{Node: w.Node, SentAt: s.f.Now}
			}
			return s.dead(2)
		}, starts: []string{"m2"}},
		{name: "detached: held", scene: func() *scene {
			s := newScene().dead(2)
			s.f.Detached["m2"] = Brake{By: "alice", Reason: "disk swap"}
			return s
		}, reasons: map[string]string{"m2": "detached by alice"}, kinds: map[string]Reason{"m2": ReasonDetached}},
		{name: "held by its owner", scene: func() *scene {
			s := newScene().dead(2)
			s.f.Inventory.Machines[2].Hold = "BareMetalHost detached"
			return s
		}, reasons: map[string]string{"m2": "BareMetalHost detached"}, kinds: map[string]Reason{"m2": ReasonHeldByOwner}},
		{name: "planned work under way: held", scene: func() *scene {
			s := newScene().dead(2)
			s.f.Inventory.Machines[2].PlannedWork = "Node node-2 is cordoned"
			return s
		}, reasons: map[string]string{"m2": "Node node-2 is cordoned"}, kinds: map[string]Reason{"m2": ReasonPlannedWork}},
		{name: "its last start failed: held until the retry", scene: func() *scene {
			s := newScene().dead(2)
			s.f.beginFailed["m2"] = BeginFailure{why: "ipmitool missing", at: s.f.Now.Add(-10 * time.Second), InARow: 4} // (16 s)
			return s
		}, reasons: map[string]string{"m2": "could not begin its remediation: ipmitool missing"}, kinds: map[string]Reason{"m2": ReasonRemediationNotBegun}},
		{name: "its first start failed 3 s ago: tried again", scene: func() *scene {
			s := newScene().dead(2)
			s.f.beginFailed["m2"] = BeginFailure{why: "journal write timed out", at: s.f.Now.Add(-3 * time.Second), InARow: 1}
			return s
		}, starts: []string{"m2"}},
		{name: "its last start failed long ago: tried again", scene: func() *scene {
			s := newScene().dead(2)
			s.f.beginFailed["m2"] = BeginFailure{why: "ipmitool missing", at: s.f.Now.Add(-time.Minute)}
			return s
		}, starts: []string{"m2"}},
		{name: "cooling down", scene: func() *scene { return newScene().dead(2).remediated(2, "reboot", journal.Succeeded, time.Minute, 1) },
			reasons: map[string]string{"m2": "cooling down until"}, kinds: map[string]Reason{"m2": ReasonCoolingDown}},
		{name: "its last remediation ended idle 10 s ago (withdrawn before its first step): held a little, not a cooldown", scene: func() *scene {
			return newScene().dead(2).remediated(2, "reboot", journal.Aborted, 10*time.Second, 1).idle(2)
		}, reasons: map[string]string{"m2": "its last remediation m2/0 ended having taken no step: tried again at"}, kinds: map[string]Reason{"m2": ReasonCoolingDown}},
		{name: "idle remediations start no cooldown, are no failed attempts and no flapping", scene: func() *scene {
			return newScene().dead(2).remediated(2, "reboot", journal.Failed, time.Minute, 3).idle(2)
		}, starts: []string{"m2"}},
		{name: "a fence stands", scene: func() *scene { return newScene().dead(2).remediated(2, "fence", journal.Succeeded, time.Hour, 1) },
			reasons: map[string]string{"m2": "fenced by remediation m2/0"}, kinds: map[string]Reason{"m2": ReasonFenced}},
		{name: "gave up after maxAttempts failed", scene: func() *scene { return newScene().dead(2).remediated(2, "reboot", journal.Failed, 10*time.Minute, 3) },
			reasons: map[string]string{"m2": "gave up after 3 failed remediations"}, kinds: map[string]Reason{"m2": ReasonGaveUp}},
		{name: "flapping", scene: func() *scene { return newScene().dead(2).remediated(2, "reboot", journal.Succeeded, 10*time.Minute, 3) },
			reasons: map[string]string{"m2": "flapping: 3 remediations in the last 1h0m0s"}, kinds: map[string]Reason{"m2": ReasonFlapping}},
		{name: "a power cycle that did not bring an unseen machine back into view is not repeated (a partition, or a host that does not boot)",
			scene: func() *scene {
				return newScene().dead(2).remediated(2, "reboot", journal.Failed, 10*time.Minute, 1).cycled(2, 20*time.Minute, 30*time.Minute)
			}, reasons: map[string]string{"m2": "power-cycled by remediation m2/0 at 2026-11-22T03:40:00Z (its BMC showed: On: Off then On observed after GracefulRestart) and seen by nobody since"},
			needs: map[string]OperatorNeed{"m2": NeedUnseen}, kinds: map[string]Reason{"m2": ReasonUnseen}},
		{name: "nor after a hub restart, which saw nothing since", scene: func() *scene {
			s := newScene().dead(2).remediated(2, "reboot", journal.Failed, 10*time.Minute, 1).cycled(2, 20*time.Minute, 0)
			delete(s.f.seenAt, "m2")
			return s
		}, reasons: map[string]string{"m2": "seen by nobody since"}, needs: map[string]OperatorNeed{"m2": NeedUnseen}, kinds: map[string]Reason{"m2": ReasonUnseen}},
		{name: "a machine seen since its cycle, that failed again, is cycled again (escalated)", scene: func() *scene {
			return newScene().dead(2).remediated(2, "reboot", journal.Failed, 10*time.Minute, 1).cycled(2, 20*time.Minute, 15*time.Minute)
		}, starts: []string{"m2"}},
		{name: "a cycle that succeeded saw the machine back (a restarted hub has no other record of it)", scene: func() *scene {
			s := newScene().dead(2).remediated(2, "reboot", journal.Succeeded, 2*time.Hour, 1).cycled(2, 2*time.Hour+time.Minute, 0)
			delete(s.f.seenAt, "m2")
			return s
		}, starts: []string{"m2"}},
		{name: "paused: held", scene: func() *scene {
			s := newScene().dead(2)
			s.f.Paused = "operator alice"
			return s
		}, held: "paused (operator alice): reboot of m2 waits for the pause to be lifted", kinds: map[string]Reason{"m2": ReasonPaused}},
		{name: "suspended: held, with the would-be plan", scene: func() *scene {
			s := newScene().dead(2)
			s.f.Suspended = true
			return s
		}, held: "suspended: would start reboot of m2", kinds: map[string]Reason{"m2": ReasonSuspended}},
		{name: "the rate limit: one slot left, two admitted", scene: func() *scene {
			s := newScene().witnesses("w-0", "w-1").dead(1).dead(2) // quorum lost: both dead members may be power-cycled
			s.f.Inventory.Policy.RateMax, s.f.RecentStarts = 3, 2
			return s
		}, starts: []string{"m1"}, held: "rate limit: 3 remediations started in the last 10m0s (max 3): m2 waits", kinds: map[string]Reason{"m2": ReasonRateLimited}},
		{name: "quorum lost: the survivor that answers, failing with it, is held; the silent members start", scene: func() *scene {
			s := newScene().witnesses("w-0", "w-1").dead(1).dead(2)
			s.f.Assessments[0] = assess.Assessment{Machine: "m0", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy, EtcdAnswers: true,
				Reasons: []string{"etcd failing for 10s: etcdserver: no leader"}}
			return s
		}, starts: []string{"m1", "m2"}, reasons: map[string]string{"m0": "etcd has lost quorum and etcd-1, etcd-2 do not answer: m0's member answers"}, kinds: map[string]Reason{"m0": ReasonSilentVotersFirst}},
		{name: "quorum lost, at a heal: a member back in view but still Suspect and silent holds the survivor too", scene: func() *scene {
			s := newScene().witnesses("w-0", "w-1").dead(1)
			s.f.Assessments[0] = assess.Assessment{Machine: "m0", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy, EtcdAnswers: true,
				Reasons: []string{"etcd failing for 16m0s: etcdserver: no leader"}}
			s.f.Assessments[1] = assess.Assessment{Machine: "m1", Verdict: assess.VerdictSuspect, EtcdHealth: quorum.Unhealthy,
				Reasons: []string{"etcd member etcd-1 unreachable from 3 of 5 expected observers for 0s"}}
			return s
		}, reasons: map[string]string{"m0": "etcd has lost quorum and etcd-1 do not answer: m0's member answers"}, kinds: map[string]Reason{"m0": ReasonSilentVotersFirst}},
		{name: "quorum lost, every voter's member answering its own status: none is cycled", scene: func() *scene {
			s := newScene().witnesses("w-0", "w-1")
			for i, m := range assesstest.Machines() {
				s.f.Assessments[i] = assess.Assessment{Machine: m.Name, Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy, OwnAnswers: true,
					Reasons: []string{"etcd failing for 10s: etcdserver: no leader"}, Since: s.f.Now.Add(-time.Minute)}
			}
			return s
		}, reasons: map[string]string{"m0": "etcd has lost quorum, and m0's member answers its status on its own machine: it runs"},
			kinds: map[string]Reason{"m0": ReasonMemberAnswers, "m1": ReasonMemberAnswers, "m2": ReasonMemberAnswers}},
		{name: "quorum lost, one voter dead, the others answering only their own agents: the dead one starts", scene: func() *scene {
			s := newScene().witnesses("w-0", "w-1").dead(2)
			for i := range 2 {
				s.f.Assessments[i] = assess.Assessment{Machine: assesstest.Machines()[i].Name, Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy, OwnAnswers: true,
					Reasons: []string{"etcd member unreachable"}, Since: s.f.Now.Add(-time.Minute)}
			}
			return s
		}, starts: []string{"m2"}, reasons: map[string]string{"m1": "etcd has lost quorum and etcd-2 do not answer: m1's member answers its status on its own machine"},
			kinds: map[string]Reason{"m0": ReasonSilentVotersFirst, "m1": ReasonSilentVotersFirst}},
		{name: "a recovery's survivor, its rebuilt cluster not yet seen healthy: held whatever its verdict", scene: func() *scene {
			s := newScene().witnesses("w-0", "w-1")
			s.f.Assessments[0] = assess.Assessment{Machine: "m0", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy,
				Reasons: []string{"etcd member etcd-0 unreachable from 3 of 5 expected observers for 5s"}, Since: s.f.Now.Add(-5 * time.Second)}
			s.f.Retired = Retirement{Token: "hale-c0-1", Cluster: "c0", survivor: Retiree{Machine: "m0", Member: "etcd-0"}}
			return s
		}, reasons: map[string]string{"m0": "m0 is the survivor etcd recovery hale-c0-1 rebuilt the cluster from"}, kinds: map[string]Reason{"m0": ReasonSurvivor}},
		{name: "a recovery's survivor, its rebuilt cluster seen healthy: healed as any machine", scene: func() *scene {
			s := newScene().witnesses("w-0", "w-1")
			s.f.Assessments[0] = assess.Assessment{Machine: "m0", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Healthy,
				Reasons: []string{"kubelet failing for 4m"}, Since: s.f.Now.Add(-4 * time.Minute)}
			s.f.Retired = Retirement{Token: "hale-c0-1", Cluster: "c0", survivor: Retiree{Machine: "m0", Member: "etcd-0"}, SurvivorSeen: true}
			return s
		}, starts: []string{"m0"}},
		{name: "quorum held: a sick machine whose member answers is not held by it", scene: func() *scene {
			s := newScene()
			s.f.Assessments[0] = assess.Assessment{Machine: "m0", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Healthy, EtcdAnswers: true,
				Reasons: []string{"kubelet failing for 4m"}, Since: s.f.Now.Add(-4 * time.Minute)}
			return s
		}, starts: []string{"m0"}},
		{name: "a probe failing alike on every voter's machine, members healthy: a common cause, none is cycled", scene: func() *scene {
			s := newScene()
			for i, m := range assesstest.Machines() {
				s.f.Assessments[i] = assess.Assessment{Machine: m.Name, Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Healthy, EtcdAnswers: true, Failing: []string{"apiserver"},
					Reasons: []string{"apiserver failing for 15s: x509: certificate is valid for 10.77.0.10, not 127.0.0.1"}, Since: s.f.Now.Add(-15 * time.Second)}
			}
			return s
		}, reasons: map[string]string{"m0": "apiserver fails on m0, m1, m2, 3 of the 3 voters' machines, while their etcd members are healthy"},
			kinds: map[string]Reason{"m0": ReasonCommonCause, "m1": ReasonCommonCause, "m2": ReasonCommonCause}},
		{name: "the first of them Unhealthy, the others failing alike still within the timeout: held all the same", scene: func() *scene {
			s := newScene()
			for i, m := range assesstest.Machines() {
				s.f.Assessments[i] = assess.Assessment{Machine: m.Name, Verdict: assess.VerdictSuspect, EtcdHealth: quorum.Healthy, EtcdAnswers: true, Failing: []string{"apiserver"}}
			}
			s.f.Assessments[0].Verdict, s.f.Assessments[0].Since = assess.VerdictUnhealthy, s.f.Now.Add(-10*time.Second)
			return s
		}, kinds: map[string]Reason{"m0": ReasonCommonCause}},
		{name: "a probe failing on one machine of three: its own fault, cycled past the component grace", scene: func() *scene {
			s := newScene()
			s.f.Assessments[1] = assess.Assessment{Machine: "m1", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Healthy, EtcdAnswers: true, Failing: []string{"apiserver"},
				Reasons: []string{"apiserver failing for 3m1s"}, Since: s.f.Now.Add(-181 * time.Second)}
			s.f.Assessments[2] = assess.Assessment{Machine: "m2", Verdict: assess.VerdictSuspect, EtcdHealth: quorum.Healthy, EtcdAnswers: true, Failing: []string{"kubelet"}}
			return s
		}, starts: []string{"m1"}},
		{name: "two machines failing alike, one of them with its member down: no majority of healthy members, cycled", scene: func() *scene {
			s := newScene().dead(2)
			s.f.Assessments[2].Failing = []string{"apiserver"}
			s.f.Assessments[1] = assess.Assessment{Machine: "m1", Verdict: assess.VerdictSuspect, EtcdHealth: quorum.Healthy, EtcdAnswers: true, Failing: []string{"apiserver"}}
			return s
		}, starts: []string{"m2"}},
		{name: "witnesses that read no etcd, two members of three silent: one agent's view is no majority", scene: func() *scene {
			s := newScene().witnesses("w-0", "w-1").dead(1).dead(2)
			for _, w := range []string{"w-0", "w-1"} {
				r := s.w.Obs.Reports[w]
				r.Etcd = nil
				s.w.Obs.Reports[w] = r
			}
			return s
		}, notPlanning: "only 1 of the 3 expected agents and witnesses that read etcd report the etcd membership (2 needed)"},
		{name: "no slot left", scene: func() *scene {
			s := newScene().dead(2)
			s.f.RecentStarts = 3
			return s
		}, held: "rate limit: 3 remediations started", kinds: map[string]Reason{"m2": ReasonRateLimited}},
		{name: "a machine in flight is not started again", scene: func() *scene {
			s := newScene().dead(2)
			s.f.Flights["m2"] = Flight{Plan: quorum.Plan{Strategy: quorum.Reboot, Steps: quorum.MustParseSteps("power-cycle etcd-2", "await-healthy etcd-2")}, Next: 1}
			return s
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.scene()
			d := s.decide()
			if tc.notPlanning != "" {
				assert.Contains(t, d.notPlanning, tc.notPlanning)
				assert.Empty(t, d.begin)
				return
			}
			require.Empty(t, d.notPlanning)
			assert.Equal(t, tc.starts, started(d))
			var brakes []string
			for _, qd := range d.outcome.Decisions {
				h, held := d.holds[qd.Machine]
				begins := slices.ContainsFunc(d.begin, func(b ToBegin) bool { return b.Machine.Name == qd.Machine })
				assert.True(t, held != (begins || qd.InFlight), "%s: held (%v), or begins or in flight, never both nor neither", qd.Machine, held)
				if held {
					assert.NotEmpty(t, h.Reason, qd.Machine)
					assert.NotEmpty(t, h.Why, qd.Machine)
				}
				if held && h.Brake() {
					brakes = append(brakes, h.Why)
				}
			}
			if tc.held == "" {
				assert.Empty(t, brakes)
			} else {
				assert.Contains(t, strings.Join(brakes, "; "), tc.held)
			}
			for m, want := range tc.kinds {
				assert.Equal(t, want, d.holds[m].Reason, m)
			}
			for m, want := range tc.reasons {
				assert.Contains(t, reasonOf(d, m), want)
			}
			for m, want := range tc.needs {
				assert.Equal(t, want, d.needs[m], m)
			}
			assert.Equal(t, d, s.decide(), "the same facts, the same decision")
		})
	}
}

// The pass in which etcd's quorum comes back decides nothing: cp-0's verdict still rests on what was
// gathered while quorum was lost ("no leader" for 16 minutes), and the hub judges it again first
// (assess.Assessor.QuorumBack; TestQuorumBackJudgesAfresh). A pass whose quorum stays lost, or stays held,
// plans as usual; a pass that finds other voters than those that lost quorum (a rebuilt cluster) decides
// nothing either.
func TestDecideWhenQuorumComesBack(t *testing.T) {
	sick := func(s *scene) *scene {
		s.f.Assessments[0] = assess.Assessment{Machine: "m0", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy, EtcdAnswers: true,
			Reasons: []string{"etcd failing for 16m0s: etcdserver: no leader"}, Since: s.f.Now.Add(-16 * time.Minute)}
		return s
	}
	s := sick(newScene().witnesses("w-0", "w-1"))
	s.f.quorumLost = true
	d := s.decide()
	assert.True(t, d.quorumBack)
	assert.Empty(t, d.begin, "nothing begins on evidence from while quorum was lost")

	s.f.quorumLost = false
	d = s.decide()
	assert.False(t, d.quorumBack)
	assert.Equal(t, []string{"m0"}, started(d), "judged afresh and still Unhealthy: healed as usual")

	s = sick(newScene().witnesses("w-0", "w-1").dead(1).dead(2))
	s.f.quorumLost = true
	d = s.decide()
	assert.False(t, d.quorumBack, "still lost")
	assert.Equal(t, []string{"m1", "m2"}, started(d))
	s.f.lostIn = d.cluster
	d = s.decide()
	assert.False(t, d.quorumBack, "still lost, by the same voters")
	assert.Equal(t, []string{"m1", "m2"}, started(d))

	// Rebuilt: the voters that lost quorum are not the voters now (a recovery from a survivor; etcd
	// changes no membership without quorum). Nothing begins on what was gathered in the old cluster.
	old := d.cluster
	old.Members = append(slices.Clone(old.Members), quorum.Member{Name: "etcd-9", Health: quorum.Unhealthy})
	s.f.lostIn = old
	d = s.decide()
	assert.True(t, d.quorumBack)
	assert.True(t, d.rebuilt)
	assert.Empty(t, d.begin)
}

// A start records what its remediation needs: the agent's start (the machine is back only with a
// later one), the members at the start, the attempt; after a failed one, a hard power cycle.
func TestDecideEscalatesAfterAFailure(t *testing.T) {
	s := newScene().dead(2).remediated(2, "reboot", journal.Failed, 10*time.Minute, 1)
	r := s.w.Obs.Reports["cp-2"]
	r.Started = assesstest.T0()
	s.w.Obs.Reports["cp-2"] = r
	d := s.decide()
	require.Len(t, d.begin, 1)
	rem := d.begin[0].Remediation
	assert.True(t, rem.Hard)
	assert.Equal(t, 2, rem.Attempt)
	assert.Contains(t, rem.Reason, "attempt 2 of 3, escalated to a hard power cycle after 1 failed")
	assert.Equal(t, assesstest.T0(), rem.AgentStarted)
	assert.Equal(t, []string{"etcd-0", "etcd-1", "etcd-2"}, rem.Members)
	assert.Equal(t, quorum.MustParseSteps("power-cycle etcd-2", "await-healthy etcd-2"), rem.Steps)
}

// A replace in Kubernetes mode names its new member with a placeholder (the owner picks the real
// name). Once the replacement has joined (here etcd-3, as a learner: kubeadm's learner mode), the
// planner is told its real steps, promote included, and a fence of that learner, which looks free,
// waits: promote etcd-3 → power-off etcd-3 → remove etcd-1 would leave 1 of 2 voters healthy.
func TestInFlightReplaceIsToldByItsRealMember(t *testing.T) {
	placeholder := quorum.Shape{Order: quorum.ScaleUpFirst, Join: quorum.JoinAsVoter}.Steps("etcd-1", "etcd-1"+NewMemberSuffix)
	fl := Flight{Plan: quorum.Plan{Strategy: quorum.Replace, Steps: placeholder}, Members: []string{"etcd-1", "etcd-2"}} // as rebuilt from the journal: no shape
	c := quorum.Cluster{Members: []quorum.Member{{Name: "etcd-1", Health: quorum.Healthy}, {Name: "etcd-2", Health: quorum.Healthy},
		{Name: "etcd-3", Learner: true, Health: quorum.Healthy}}}

	assert.Equal(t, placeholder, fl.StillToCome(quorum.Cluster{Members: c.Members[:2]}), "not joined yet: the placeholder steps stand")
	real := fl.StillToCome(c)
	assert.Equal(t, quorum.Shape{Order: quorum.ScaleUpFirst, Join: quorum.JoinAsLearner}.Steps("etcd-1", "etcd-3"), real)

	in := quorum.Input{Cluster: c, Policy: quorum.DefaultPolicy(), Machines: []quorum.Machine{
		{Name: "cp-1", Member: "etcd-1", InFlight: true, Strategy: quorum.Replace, Remaining: real},
		{Name: "cp-3", Member: "etcd-3", Unhealthy: true, Strategy: quorum.Fence}}}
	out, err := quorum.PlanPass(in)
	require.NoError(t, err)
	assert.Empty(t, out.Started())
	assert.Contains(t, out.Decisions[1].Reason, "fencing etcd-3 is unsafe beside the work in flight")
	assert.Contains(t, out.Decisions[1].Reason, "promote etcd-3")
}

// etcd rebuilt without `hub recover` (by hand, from m0's member): the cluster's ID changed and the
// new cluster lists etcd-0 alone. m1 and m2, dead and in no membership, wait for a consistent view
// that will not come, and `hub reboot --force` would power both on: two old members on their old
// data are the old cluster's quorum. The pass that first sees the new membership retires them (held
// as Retired, what to do said; `hub reboot` checks the old quorum); a recovery of Hale's that retired
// the old cluster itself needs nothing more.
func TestDecideRetiresARebuildOutsideHale(t *testing.T) {
	s := newScene().witnesses("w-0", "w-1").dead(1).dead(2)
	for n, r := range s.w.Obs.Reports {
		if r.Etcd != nil {
			e := *r.Etcd
			e.Members = slices.DeleteFunc(slices.Clone(e.Members), func(m report.EtcdMember) bool { return m.Name != "etcd-0" })
			r.Etcd = &e
			s.w.Obs.Reports[n] = r
		}
	}
	d := s.decide()
	assert.Empty(t, d.begin)
	assert.Equal(t, ReasonWaiting, d.holds["m1"].Reason, "without the rebuild known: waiting for a view that will not come")

	s.f.rebuilt = &clusterChange{from: "c1", to: "c2"}
	d = s.decide()
	require.NotNil(t, d.retire)
	assert.Empty(t, d.begin)
	assert.Equal(t, "rebuilt-c2", d.retire.Plan.Token)
	assert.Equal(t, "c1", d.retire.Plan.Survivor.ClusterID)
	assert.Equal(t, 2, d.retire.Plan.Loss.Quorum, "the inventory's three members taken for the old cluster")
	var left []string
	for _, f := range d.retire.Plan.Fence {
		left = append(left, f.Machine)
		assert.False(t, f.Fenced)
	}
	assert.Equal(t, []string{"m1", "m2"}, left)
	for _, m := range []string{"m1", "m2"} {
		assert.Equal(t, ReasonRetired, d.holds[m].Reason, m)
		assert.Equal(t, NeedRetired, d.needs[m], m)
	}
	assert.Contains(t, d.retire.rebuiltOutsideMessage(), "etcd cluster c1 was rebuilt as c2 without `hub recover` (by hand?), and m1 (etcd-1), m2 (etcd-2) are not in it")

	s.f.Retired = RetirementOf(d.retire) // journaled: the next pass, or a recovery of Hale's
	s.f.rebuilt.from = "c1"
	d = s.decide()
	assert.Nil(t, d.retire, "retired already")
	assert.Empty(t, d.begin)
}

// A rebuild whose new cluster kept every member retires nobody, and the pass forgets it once the
// observers agree on that membership: pending, a later member removal (an owner's replace) would be
// taken for one the rebuild left out.
func TestStepForgetsARebuildThatLeftNobodyOut(t *testing.T) {
	sc := newScene().witnesses("w-0", "w-1")
	sc.f.Observations = sc.w.Obs
	sc.f.Hearing = assess.Hear(assess.ExpectedOf(sc.f.Inventory.Refs(), sc.f.Inventory.Witnesses), sc.f.Observations, sc.f.Inventory.Policy.Assess.StaleAfter)
	s := NewState()
	s.rebuilt = &clusterChange{from: "c1", to: "c2"}
	next, rd := Compute(s, sc.f)
	assert.Nil(t, rd.Retire)
	assert.Nil(t, next.rebuilt)
}

// The survivor of a recovery is held until a pass sees the rebuilt cluster healthy on it: its member
// healthy, in a cluster other than the old one, reached by a strict majority of the expected judges of
// etcd in reports since its change of cluster (DESIGN.md rule 13).
func TestTheRebuiltClusterSeenHealthy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cluster string
		reached int
		health  quorum.Health
		seen    bool
	}{
		{"a strict majority of five judges, in the new cluster", "c1", 3, quorum.Healthy, true},
		{"two of five", "c1", 2, quorum.Healthy, false},
		{"still the old cluster", "c0", 5, quorum.Healthy, false},
		{"not healthy", "c1", 3, quorum.HealthUnknown, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScene().witnesses("w-0", "w-1")
			s.f.Retired = Retirement{Token: "hale-c0-1", Cluster: "c0", survivor: Retiree{Machine: "m0", Member: "etcd-0"}}
			s.w.Answering("cp-0", "a0", tc.cluster)
			s.f.Assessments[0].EtcdReachedSince, s.f.Assessments[0].EtcdHealth = tc.reached, tc.health
			assert.Equal(t, tc.seen, s.decide().survivorSeen)
		})
	}
}

// A machine under planned work that really dies still costs etcd its vote: it is held, and the
// planner counts its member unhealthy (2 of 3 voters healthy), so that whatever is planned for the
// others is judged against the quorum that is really left.
func TestPlannedWorkStillCostsItsVote(t *testing.T) {
	s := newScene().dead(1)
	s.f.Inventory.Machines[1].PlannedWork = "Node node-1 is cordoned"
	d := s.decide()
	assert.Equal(t, ReasonPlannedWork, d.holds["m1"].Reason)
	assert.Empty(t, d.begin, "nothing begins on a machine under planned work")
	b := d.cluster.Budget(s.f.Inventory.Policy.Quorum)
	assert.Equal(t, 2, b.HealthyVoters, "its member counts as unhealthy: %s", b)
}
