package assess_test

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/health/report"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/assess/assesstest"
	"github.com/hale-dev/hale/quorum"
)

func TestAssess(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	tests := []struct {
		name       string
		world      *assesstest.World
		policy     func(*assess.Policy)
		machine    string
		verdict    assess.Verdict
		etcd       quorum.Health
		reason     string
		wantSince  time.Time
		allHealthy bool
		failing    []string
	}{
		{name: "all well", world: assesstest.NewWorld(now), machine: "m1", verdict: assess.VerdictHealthy, etcd: quorum.Healthy},
		{name: "dead per the hub and every observer", world: assesstest.NewWorld(now).Dead("cp-2", now.Add(-2*time.Second), "cp-0", "cp-1"),
			machine: "m2", verdict: assess.VerdictUnhealthy, etcd: quorum.Unhealthy, reason: "cp-2 dead since", wantSince: now.Add(-2 * time.Second)},
		{name: "the hub alone lost sight: never enough", world: assesstest.NewWorld(now).Dead("cp-2", now.Add(-time.Minute)),
			machine: "m2", verdict: assess.VerdictSuspect, etcd: quorum.Healthy,
			reason: "the hub lost sight of cp-2, but only 1 of 4 expected observers see it dead (the hub and 0 of the 2 others it hears; a strict majority is 3): not corroborated"},
		{name: "the hub and one observer of four expected is no majority", world: assesstest.NewWorld(now).Dead("cp-2", now.Add(-time.Minute), "cp-0"),
			machine: "m2", verdict: assess.VerdictSuspect, reason: "only 2 of 4 expected observers"},
		{name: "dead per the hub and both others: 3 of 4", world: assesstest.NewWorld(now).Dead("cp-2", now.Add(-time.Second), "cp-0", "cp-1"),
			machine: "m2", verdict: assess.VerdictUnhealthy, reason: "per 3 of 4 expected observers (the hub and 2 others)"},
		{name: "two of three dead, no witness: the survivor and the hub are no majority", world: assesstest.NewWorld(now).Cut(now.Add(-time.Second), "cp-1").Dead("cp-2", now.Add(-time.Second), "cp-0"),
			machine: "m2", verdict: assess.VerdictSuspect, reason: "only 2 of 4 expected observers see it dead"},
		{name: "two of three dead, two witnesses: 4 of 6 see it dead", world: assesstest.NewWorld(now).Witness("w-1", "w-2").Cut(now.Add(-time.Second), "cp-1").
			Dead("cp-2", now.Add(-time.Second), "cp-0", "w-1", "w-2"),
			machine: "m2", verdict: assess.VerdictUnhealthy, etcd: quorum.Unhealthy, reason: "per 4 of 6 expected observers (the hub and 3 others)"},
		{name: "the hub and cp-0 cut off from cp-1 and cp-2 (both witnesses with them): cp-0's word is no majority",
			world:   assesstest.NewWorld(now).Witness("w-1", "w-2").Cut(now.Add(-time.Second), "cp-1", "w-1", "w-2").Dead("cp-2", now.Add(-time.Second), "cp-0"),
			machine: "m2", verdict: assess.VerdictSuspect, reason: "only 2 of 6 expected observers see it dead"},
		{name: "an observer outside the expected set is no vote", world: func() *assesstest.World {
			w := assesstest.NewWorld(now).Dead("cp-2", now.Add(-time.Second), "cp-0")
			w.Obs.HubPeers["stranger"] = report.PeerView{Name: "stranger", State: report.PeerAlive}
			w.Obs.Reports["stranger"] = report.Report{Node: "stranger", SentAt: now, Peers: []report.PeerView{{Name: "cp-2", State: report.PeerDead, Since: now.Add(-time.Second)}}}
			return w
		}(), machine: "m2", verdict: assess.VerdictSuspect, reason: "only 2 of 4 expected observers"},
		{name: "only the agent died (crashed, stopped): its etcd member still answers every other observer, so the machine is not dead (test/chaos seed 1: rebooting it cost quorum)",
			world:   assesstest.NewWorld(now).Witness("w-1", "w-2").AgentDead("cp-2", now.Add(-time.Minute), "cp-0", "cp-1", "w-1", "w-2"),
			machine: "m2", verdict: assess.VerdictSuspect, etcd: quorum.Healthy,
			reason: "cp-2's agent is gone per 5 of 6 expected observers, but its etcd member etcd-2 answers 2 of the 2 observers that check it: the agent is down, not the machine"},
		{name: "the agent died and its member answers no majority of those that check it: dead", world: assesstest.NewWorld(now).AgentDead("cp-2", now.Add(-time.Second), "cp-0", "cp-1").
			Unreachable("etcd-2", "cp-0"), machine: "m2", verdict: assess.VerdictUnhealthy, etcd: quorum.Unhealthy, reason: "cp-2 dead since"},
		{name: "dead for less than DeadTimeout", world: assesstest.NewWorld(now).Dead("cp-2", now.Add(-time.Second), "cp-0", "cp-1"),
			policy: func(p *assess.Policy) { p.DeadTimeout = 5 * time.Second }, machine: "m2", verdict: assess.VerdictSuspect, reason: "unhealthy at 5s"},
		{name: "kubelet failing short of its timeout", failing: []string{"kubelet"}, world: assesstest.NewWorld(now).Probe("cp-1", "kubelet", false, now.Add(-3*time.Second)),
			machine: "m1", verdict: assess.VerdictSuspect, etcd: quorum.Healthy, reason: "kubelet failing for 3s (unhealthy at 10s): connection refused"},
		{name: "kubelet failing past its timeout", failing: []string{"kubelet"}, world: assesstest.NewWorld(now).Probe("cp-1", "kubelet", false, now.Add(-12*time.Second)),
			machine: "m1", verdict: assess.VerdictUnhealthy, etcd: quorum.Healthy, reason: "kubelet failing for 12s (unhealthy at 10s)", wantSince: now.Add(-12 * time.Second)},
		{name: "a probe without a timeout never makes a machine unhealthy", world: assesstest.NewWorld(now).Probe("cp-1", "kubelet", false, now.Add(-time.Hour)),
			policy: func(p *assess.Policy) { delete(p.ProbeTimeouts, "kubelet") }, machine: "m1", verdict: assess.VerdictHealthy, etcd: quorum.Healthy},
		{name: "own etcd probe failing: member unhealthy for quorum", failing: []string{"etcd"}, world: assesstest.NewWorld(now).Probe("cp-1", "etcd", false, now.Add(-2*time.Second)),
			machine: "m1", verdict: assess.VerdictSuspect, etcd: quorum.Unhealthy, reason: "etcd failing for 2s"},
		{name: "a failure counts until the report that carries it, not until now (test/chaos seed 3: the agent died while its probe failed)", failing: []string{"etcd"}, world: func() *assesstest.World {
			w := assesstest.NewWorld(now).Probe("cp-1", "etcd", false, now.Add(-20*time.Second))
			r := w.Obs.Reports["cp-1"]
			r.SentAt = now.Add(-15 * time.Second) // still fresh; the failure is known to have lasted 5 s
			w.Obs.Reports["cp-1"] = r
			return w
		}(), machine: "m1", verdict: assess.VerdictSuspect, etcd: quorum.Unhealthy, reason: "etcd failing for 5s (unhealthy at 10s)"},
		{name: "a stale report is no evidence", world: func() *assesstest.World {
			w := assesstest.NewWorld(now)
			r := w.Obs.Reports["cp-1"]
			r.SentAt = now.Add(-time.Minute)
			w.Obs.Reports["cp-1"] = r
			return w
		}(), machine: "m1", verdict: assess.VerdictSuspect, reason: "no fresh report from cp-1"},
		{name: "left on purpose", world: func() *assesstest.World {
			w := assesstest.NewWorld(now)
			w.Obs.HubPeers["cp-1"] = report.PeerView{Name: "cp-1", State: report.PeerLeft, Since: now}
			return w
		}(), machine: "m1", verdict: assess.VerdictSuspect, reason: "left the gossip pool on purpose"},
		{name: "member unreachable from a majority starts a timer", world: assesstest.NewWorld(now).Unreachable("etcd-2", "cp-0", "cp-1"),
			machine: "m2", verdict: assess.VerdictSuspect, etcd: quorum.Unhealthy, reason: "etcd member etcd-2 unreachable from 2 of 3 expected observers for 0s (unhealthy at 5s)"},
		{name: "member unreachable from the only agent heard: no majority of the agents and witnesses", world: assesstest.NewWorld(now).Witness("w-1", "w-2").
			Cut(now.Add(-time.Second), "cp-1", "w-1", "w-2").Unreachable("etcd-2", "cp-0", "cp-2"),
			machine: "m2", verdict: assess.VerdictSuspect, etcd: quorum.HealthUnknown, reason: "etcd member etcd-2 unreachable from 2 of the 2 observers that report on it, but that is no strict majority of the 5 expected agents and witnesses"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := assess.DefaultPolicy()
			if tt.policy != nil {
				tt.policy(&p)
			}
			got := assesstest.ByName(assesstest.Hearing(p).Assess(assesstest.Machines(), tt.world.Witnesses, tt.world.Obs))[tt.machine]
			assert.Equal(t, tt.verdict, got.Verdict, "%+v", got)
			if tt.etcd != 0 || tt.verdict == assess.VerdictHealthy {
				assert.Equal(t, tt.etcd, got.EtcdHealth, "%+v", got)
			}
			if tt.reason != "" {
				assert.Contains(t, joinLines(got.Reasons), tt.reason)
			}
			if !tt.wantSince.IsZero() {
				assert.Equal(t, tt.wantSince, got.Since)
			}
			assert.Equal(t, tt.failing, got.Failing)
		})
	}
}

func TestHear(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	for _, tc := range []struct {
		name     string
		world    *assesstest.World
		heard    []string
		majority bool
	}{
		{"everyone", assesstest.NewWorld(now), []string{"the hub", "cp-0", "cp-1", "cp-2"}, true},
		{"one agent lost: 3 of 4", assesstest.NewWorld(now).Cut(now, "cp-2"), []string{"the hub", "cp-0", "cp-1"}, true},
		{"the hub with cp-0 only: 2 of 4", assesstest.NewWorld(now).Cut(now, "cp-1", "cp-2"), []string{"the hub", "cp-0"}, false},
		{"two of three gone, two witnesses: 4 of 6", assesstest.NewWorld(now).Witness("w-1", "w-2").Cut(now, "cp-1", "cp-2"), []string{"the hub", "cp-0", "w-1", "w-2"}, true},
		{"the hub and cp-0 cut off from everyone else: 2 of 6", assesstest.NewWorld(now).Witness("w-1", "w-2").Cut(now, "cp-1", "cp-2", "w-1", "w-2"), []string{"the hub", "cp-0"}, false},
		{"a live member whose report is stale is not heard", func() *assesstest.World {
			w := assesstest.NewWorld(now)
			r := w.Obs.Reports["cp-1"]
			r.SentAt = now.Add(-time.Minute)
			w.Obs.Reports["cp-1"] = r
			return w
		}(), []string{"the hub", "cp-0", "cp-2"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := assess.Hear(assess.ExpectedOf(assesstest.Machines(), tc.world.Witnesses), tc.world.Obs, assess.DefaultPolicy().StaleAfter)
			assert.Equal(t, tc.heard, h.Heard)
			assert.Equal(t, tc.majority, h.Majority())
			if !tc.majority {
				assert.Contains(t, h.NoMajority(), "a partition and a crash look the same from here")
			}
		})
	}
}

// Through is as far as the reports of a strict majority of the expected observers reach: the hub's
// now, and the freshest reports the majority needs beside it, never past now.
func TestHearingThrough(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	sent := func(w *assesstest.World, node string, at time.Time) *assesstest.World {
		r := w.Obs.Reports[node]
		r.SentAt = at
		w.Obs.Reports[node] = r
		return w
	}
	for _, tc := range []struct {
		name    string
		world   *assesstest.World
		through time.Time
	}{
		{"every report sent now: through now", assesstest.NewWorld(now), now},
		{"6 expected, the hub and the third freshest of five", sent(assesstest.NewWorld(now).Witness("w-1", "w-2"), "cp-2", now.Add(-3*time.Second)), now.Add(-time.Second)},
		{"6 expected, three others heard: the oldest of them", assesstest.NewWorld(now).Witness("w-1", "w-2").Cut(now, "cp-1", "cp-2"), now.Add(-time.Second)},
		{"6 expected, two others heard: no majority, through nothing", assesstest.NewWorld(now).Witness("w-1", "w-2").Cut(now, "cp-1", "cp-2", "w-2"), time.Time{}},
		{"clocks ahead of the hub's say no more than now", sent(sent(assesstest.NewWorld(now), "cp-0", now.Add(5*time.Second)), "cp-1", now.Add(5*time.Second)), now},
	} {
		t.Run(tc.name, func(t *testing.T) {
			machines := assesstest.Machines()
			h := assess.Hear(assess.ExpectedOf(machines, tc.world.Witnesses), tc.world.Obs, assess.DefaultPolicy().StaleAfter)
			assert.Equal(t, tc.through, h.Through(now))
			a := assesstest.Hearing(assess.DefaultPolicy())
			for range 2 { // the assessor's own, its buffer used again
				_, h = a.AssessHearing(machines, tc.world.Witnesses, tc.world.Obs)
				assert.Equal(t, tc.through, h.Through(now))
			}
		})
	}
}

// Time without a majority of observers is no evidence: after a partition heals (or at the hub's start)
// a probe that failed all along must fail for its whole timeout again before it counts. (Found by the
// network-namespace partition test: cp-0, on the minority side, failed its own etcd probe, "no
// leader", for the whole partition, and was power-cycled the moment the partition healed.) The
// verdict's since is the heal too.
func TestTimedEvidenceCountsFromWhenAMajorityIsHeard(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	a := assesstest.Hearing(assess.DefaultPolicy())
	failing := func(w *assesstest.World) *assesstest.World {
		return w.Probe("cp-0", "etcd", false, now.Add(-time.Minute))
	}
	// Cut off: the hub hears cp-0 only.
	cut := failing(assesstest.NewWorld(now.Add(-30*time.Second)).Cut(now.Add(-time.Minute), "cp-1", "cp-2"))
	cut.Obs.Now = now.Add(-30 * time.Second)
	require.False(t, assess.Hear(assess.ExpectedOf(assesstest.Machines(), nil), cut.Obs, assess.DefaultPolicy().StaleAfter).Majority())
	// While cut off, nothing is counted at all: a verdict made then (shown, alerted on, its episode
	// begun) must not count the partition's time either, though nothing is done without a majority.
	// (Found under load: a pass that heard 2 of 4 observers 6 s after a heal said "Unhealthy: etcd
	// failing for 1m10s", counted from before the partition.)
	got := assesstest.ByName(a.Assess(assesstest.Machines(), nil, cut.Obs))["m0"]
	assert.Equal(t, assess.VerdictSuspect, got.Verdict, "%+v", got)
	assert.Contains(t, joinLines(got.Reasons), "etcd failing for 30s, not counted while the hub hears no majority of its observers")
	// Healed: the probe has failed for a minute, but only for 0 s since a majority is heard.
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, failing(assesstest.NewWorld(now)).Obs))["m0"]
	assert.Equal(t, assess.VerdictSuspect, got.Verdict, "%+v", got)
	assert.Contains(t, joinLines(got.Reasons), "etcd failing for 1m0s, counted from ")
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, failing(assesstest.NewWorld(now.Add(9*time.Second))).Obs))["m0"]
	assert.Equal(t, assess.VerdictSuspect, got.Verdict)
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, failing(assesstest.NewWorld(now.Add(10*time.Second))).Obs))["m0"]
	assert.Equal(t, assess.VerdictUnhealthy, got.Verdict, "failing for the whole timeout since the heal")
	// And its since is the heal, not the probe's first failure: the component grace counts from it (a
	// partition longer than the grace once left a member catching up after the heal no grace at all).
	assert.Equal(t, now, got.Since, "since")
	// Dead is not timed (deadTimeout 0): a machine dead per a majority counts at once, heal or not.
	b := assess.NewAssessor(assess.DefaultPolicy())
	got = assesstest.ByName(b.Assess(assesstest.Machines(), nil, assesstest.NewWorld(now).Dead("cp-2", now.Add(-time.Second), "cp-0", "cp-1").Obs))["m2"]
	assert.Equal(t, assess.VerdictUnhealthy, got.Verdict)
}

func joinLines(rs []string) string {
	out := ""
	for _, r := range rs {
		out += r + "\n"
	}
	return out
}

// A condition without a since of its own is timed by the assessor across passes, and forgotten when
// it clears.
func TestAssessTimesUnreachableMembers(t *testing.T) {
	a := assesstest.Hearing(assess.DefaultPolicy())
	now := assesstest.T0().Add(time.Hour)
	got := assesstest.ByName(a.Assess(assesstest.Machines(), nil, assesstest.NewWorld(now).Unreachable("etcd-2", "cp-0", "cp-1").Obs))["m2"]
	require.Equal(t, assess.VerdictSuspect, got.Verdict)
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, assesstest.NewWorld(now.Add(6*time.Second)).Unreachable("etcd-2", "cp-0", "cp-1").Obs))["m2"]
	require.Equal(t, assess.VerdictUnhealthy, got.Verdict, "%+v", got)
	assert.Equal(t, now, got.Since)
	assert.Contains(t, got.Reasons[0], "etcd member etcd-2 unreachable from 2 of 3 expected observers for 6s")
	assert.False(t, got.EtcdAnswers, "a member the majority cannot reach does not answer")

	// A member that answers fails its own probe (as every member does with quorum lost): it answers.
	w := assesstest.NewWorld(now.Add(6*time.Second)).Probe("cp-0", "etcd", false, now.Add(-time.Minute))
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, w.Obs))["m0"]
	assert.Equal(t, assess.VerdictUnhealthy, got.Verdict)
	assert.True(t, got.EtcdAnswers, "%+v", got)
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, assesstest.NewWorld(now.Add(6*time.Second)).Dead("cp-1", now, "cp-0", "cp-2").Obs))["m1"]
	assert.False(t, got.EtcdAnswers, "a dead machine's member does not answer")

	// Reachable again: healthy, and the timer starts afresh next time.
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, assesstest.NewWorld(now.Add(7*time.Second)).Obs))["m2"]
	assert.Equal(t, assess.VerdictHealthy, got.Verdict)
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, assesstest.NewWorld(now.Add(8*time.Second)).Unreachable("etcd-2", "cp-0", "cp-1").Obs))["m2"]
	assert.Equal(t, assess.VerdictSuspect, got.Verdict)
}

func TestAssessWorkerWithoutMember(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	w := assesstest.NewWorld(now)
	w.Obs.HubPeers["w-1"] = report.PeerView{Name: "w-1", State: report.PeerAlive}
	w.Obs.Reports["w-1"] = report.Report{Node: "w-1", SentAt: now, Probes: []report.ProbeResult{{Name: "kubelet", OK: false, Since: now.Add(-time.Minute)}}}
	got := assesstest.ByName(assesstest.Hearing(assess.DefaultPolicy()).Assess([]assess.MachineRef{{Name: "w1", Node: "w-1"}}, nil, w.Obs))["w1"]
	assert.Equal(t, assess.VerdictUnhealthy, got.Verdict)
	assert.Equal(t, quorum.HealthUnknown, got.EtcdHealth)
}

// A Node condition is evidence, never enough alone: Ready=Unknown past its timeout makes a machine
// Unhealthy only with something else against it.
func TestAssessNodeConditions(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	notReady := func(for_ time.Duration) []assess.NodeCondition {
		return []assess.NodeCondition{{Type: "Ready", Status: "Unknown", Reason: "NodeStatusUnknown", Since: now.Add(-for_)}}
	}
	for _, tc := range []struct {
		name       string
		conditions []assess.NodeCondition
		kubelet    bool // the agent's kubelet probe failing for 2 s (under its 10 s timeout)
		want       assess.Verdict
		reason     string
	}{
		{"Ready=True", []assess.NodeCondition{{Type: "Ready", Status: "True", Since: assesstest.T0()}}, false, assess.VerdictHealthy, ""},
		{"not Ready long, nothing else", notReady(time.Minute), false, assess.VerdictSuspect, "node cp-2 Ready=Unknown (NodeStatusUnknown) for 1m0s, but nothing else stands against it: not enough alone"},
		{"not Ready long, kubelet probe failing", notReady(time.Minute), true, assess.VerdictUnhealthy, "node cp-2 Ready=Unknown (NodeStatusUnknown) for 1m0s, with the evidence above"},
		{"not Ready briefly, kubelet probe failing", notReady(5 * time.Second), true, assess.VerdictSuspect, "node cp-2 Ready=Unknown (NodeStatusUnknown) for 5s (counts at 30s)"},
		{"a pressure condition not listed", []assess.NodeCondition{{Type: "DiskPressure", Status: "True", Since: assesstest.T0()}}, true, assess.VerdictSuspect, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := assesstest.NewWorld(now)
			if tc.kubelet {
				r := w.Obs.Reports["cp-2"]
				r.Probes[0] = report.ProbeResult{Name: "kubelet", OK: false, Since: now.Add(-2 * time.Second), Detail: "connection refused"}
				w.Obs.Reports["cp-2"] = r
			}
			ms := slices.Clone(assesstest.Machines())
			ms[2].Conditions = tc.conditions
			got := assesstest.Hearing(assess.DefaultPolicy()).Assess(ms, nil, w.Obs)[2]
			assert.Equal(t, tc.want, got.Verdict, got.Reasons)
			if tc.reason != "" {
				assert.Contains(t, got.Reasons, tc.reason)
			}
		})
	}
}

// A death that began while the hub heard no majority must still stand rejoinSettle after the hub hears
// one again: the observers' views from the partition lag a report or two (test/chaos seed 3).
func TestDeathFromBeforeARegainedMajoritySettles(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	a := assesstest.Hearing(assess.DefaultPolicy())
	cut := assesstest.NewWorld(now.Add(-10*time.Second)).Versioned(1).Cut(now.Add(-20*time.Second), "cp-1", "cp-2")
	a.Assess(assesstest.Machines(), nil, cut.Obs) // no majority: lost
	dead := func(at time.Time, version uint64) assess.Assessment {
		return assesstest.ByName(a.Assess(assesstest.Machines(), nil, assesstest.NewWorld(at).Versioned(version).Dead("cp-2", now.Add(-15*time.Second), "cp-0", "cp-1").Obs))["m2"]
	}
	got := dead(now, 2)
	assert.Equal(t, assess.VerdictSuspect, got.Verdict, "just after the majority came back: %q", got.Reasons)
	got = dead(now.Add(assess.RejoinSettle), 3)
	assert.Equal(t, assess.VerdictUnhealthy, got.Verdict, "still dead 5 s later, in newer reports: %q", got.Reasons)
}

// Judge takes in what a round says happened to the hub before it judges. A hub that was not running
// (stopped, frozen) holds a view as old as its pause (test/chaos seeds 96 and 100); evidence gathered
// while it was paused counts from its resume; what was gathered while etcd's quorum was lost is stale
// once it is back. Each makes timed evidence count again from the round, as after a partition.
func TestJudgeTakesInTheRound(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	for name, round := range map[string]assess.Round{
		"the hub was not running": {HeardNothing: true},
		"the hub was resumed":     {ResumedAt: now},
		"etcd's quorum came back": {QuorumBack: now},
	} {
		t.Run(name, func(t *testing.T) {
			a := assesstest.Hearing(assess.DefaultPolicy())
			judge := func(at time.Time, r assess.Round) assess.Assessment {
				r.Policy, r.Machines = assess.DefaultPolicy(), assesstest.Machines()
				r.Obs = assesstest.NewWorld(at).Probe("cp-2", "etcd", false, now.Add(-time.Minute)).Obs
				out, _ := a.Judge(r)
				return assesstest.ByName(out)["m2"]
			}
			require.Equal(t, assess.VerdictUnhealthy, judge(now, assess.Round{}).Verdict, "failing for a minute")
			got := judge(now.Add(time.Second), round)
			assert.Equal(t, assess.VerdictSuspect, got.Verdict, "%v", got.Reasons)
			assert.Contains(t, joinLines(got.Reasons), "counted from")
			got = judge(now.Add(time.Minute), assess.Round{})
			assert.Equal(t, assess.VerdictUnhealthy, got.Verdict, "still failing a minute later: %v", got.Reasons)
		})
	}
}

// A hang the machine's BMC logged since its last sign of life tells a dead machine from a dead agent
// when the views of its member are too old to: a machine that panics as etcd's leader makes the others
// lose their leader for a moment, and the return of quorum must not keep its reboot waiting for newer
// reports (a loaded stall matrix). It never outweighs views that say its member answers, and an entry
// from an earlier episode proves nothing; the settling after a regained majority ends with it too.
func TestABMCProvedHangEndsTheWaitForNewerViews(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	panicked := func(at time.Time) map[string][]bmcval.LogEntry {
		return map[string][]bmcval.LogEntry{"m2": {{ID: "9", Kind: bmcval.HangOSCriticalStop, Message: "OS Stop/Shutdown: Run-time critical stop", At: at}}}
	}
	afterACut := func() *assess.Assessor {
		a := assesstest.Hearing(assess.DefaultPolicy())
		a.Assess(assesstest.Machines(), nil, assesstest.NewWorld(now.Add(-30*time.Second)).Versioned(1).Cut(now.Add(-time.Minute), "cp-1", "cp-2").Obs)
		return a
	}
	for _, tc := range []struct {
		name    string
		world   func() assess.Observations
		verdict assess.Verdict
		reason  string
		gone    bool
	}{
		{name: "views from before the return, no proof: it waits for newer ones", world: func() assess.Observations {
			return assesstest.NewWorld(now).Versioned(2).Dead("cp-2", now, "cp-0", "cp-1").Obs
		}, verdict: assess.VerdictSuspect, reason: "waiting for newer ones", gone: true},
		{name: "views from before the return, a panic logged as it died: dead now", world: func() assess.Observations {
			w := assesstest.NewWorld(now).Versioned(2).Dead("cp-2", now, "cp-0", "cp-1")
			w.Obs.Hangs = panicked(now.Add(-time.Second))
			return w.Obs
		}, verdict: assess.VerdictUnhealthy, reason: "its BMC's event log has OS critical stop at", gone: true},
		{name: "views from before the return, a panic of an hour ago: it waits", world: func() assess.Observations {
			w := assesstest.NewWorld(now).Versioned(2).Dead("cp-2", now, "cp-0", "cp-1")
			w.Obs.Hangs = panicked(now.Add(-time.Hour))
			return w.Obs
		}, verdict: assess.VerdictSuspect, reason: "waiting for newer ones", gone: true},
		{name: "newer views say its member answers: the agent is down, whatever the log says", world: func() assess.Observations {
			w := assesstest.NewWorld(now.Add(time.Second)).Versioned(2).AgentDead("cp-2", now, "cp-0", "cp-1")
			w.Obs.Hangs = panicked(now)
			return w.Obs
		}, verdict: assess.VerdictSuspect, reason: "the agent is down, not the machine"},
		{name: "newer views, dead, within the settling after the regained majority: it waits", world: func() assess.Observations {
			return assesstest.NewWorld(now.Add(time.Second)).Versioned(3).Dead("cp-2", now.Add(-40*time.Second), "cp-0", "cp-1").Obs
		}, verdict: assess.VerdictSuspect, reason: "(unhealthy at 5s)", gone: true},
		{name: "newer views, dead, within the settling, its panic logged: dead now", world: func() assess.Observations {
			w := assesstest.NewWorld(now.Add(time.Second)).Versioned(3).Dead("cp-2", now.Add(-40*time.Second), "cp-0", "cp-1")
			w.Obs.Hangs = panicked(now) // its own last report (the world's) went out a second later
			return w.Obs
		}, verdict: assess.VerdictUnhealthy, reason: "the machine is down, not only its agent", gone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := afterACut()
			// The first pass that hears a majority again, its reports holding the views from the cut.
			a.Assess(assesstest.Machines(), nil, assesstest.NewWorld(now).Versioned(2).Dead("cp-2", now.Add(-40*time.Second), "cp-0", "cp-1").Obs)
			got := assesstest.ByName(a.Assess(assesstest.Machines(), nil, tc.world()))["m2"]
			assert.Equal(t, tc.verdict, got.Verdict, "%q", got.Reasons)
			assert.Contains(t, joinLines(got.Reasons), tc.reason)
			assert.Equal(t, tc.gone, got.Gone, "gone")
			assert.Equal(t, tc.verdict == assess.VerdictUnhealthy, got.Dead, "dead")
		})
	}
}

// When etcd's quorum comes back, what was gathered while it was lost is no evidence: a survivor's
// "no leader", failing for 16 minutes, counts again from the return, and a report sent before it can
// make no machine Unhealthy (the far-side partition: cp-0 power-cycled 0.4 s after the heal on its
// last report from the partition).
func TestQuorumBackJudgesAfresh(t *testing.T) {
	back := assesstest.T0().Add(time.Hour)
	a := assesstest.Hearing(assess.DefaultPolicy())
	w := assesstest.NewWorld(back.Add(300*time.Millisecond)).Probe("cp-0", "etcd", false, back.Add(-16*time.Minute))
	stale := w.Obs.Reports["cp-0"]
	stale.SentAt = back.Add(-500 * time.Millisecond) // from the partition
	w.Obs.Reports["cp-0"] = stale
	got := assesstest.ByName(a.Assess(assesstest.Machines(), nil, w.Obs))["m0"]
	require.Equal(t, assess.VerdictUnhealthy, got.Verdict, "without the return it is Unhealthy on the stale report: the case QuorumBack exists for")

	a.QuorumBack(back)
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, w.Obs))["m0"]
	assert.Equal(t, assess.VerdictSuspect, got.Verdict, "%q", got.Reasons)
	assert.Contains(t, got.Reasons[0], "when etcd's quorum came back")

	// Still failing in reports sent after the return, for the whole timeout: judged as usual.
	w.Obs.Now = back.Add(11 * time.Second)
	fresh := w.Obs.Reports["cp-0"]
	fresh.SentAt = back.Add(10500 * time.Millisecond)
	w.Obs.Reports["cp-0"] = fresh
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, w.Obs))["m0"]
	assert.Equal(t, assess.VerdictUnhealthy, got.Verdict, "%q", got.Reasons)
}

// Right after etcd's quorum comes back, a member whose machine hung has only its own last report, sent
// before it hung and still fresh by age, and its observers' views from before the return, which say it
// does not answer and are set aside: it is not counted healthy until something newer says so (test/lab
// under load: counted healthy on its old word, it let an operator's reboot of cp-0 through, and quorum
// was lost). Its own word newer than the return counts, and so do newer views, for it or against it.
func TestAMemberSilentSinceQuorumCameBackIsNotCountedHealthy(t *testing.T) {
	back := assesstest.T0().Add(time.Hour)
	stopped := back.Add(-4 * time.Second)
	world := func(at time.Time, version uint64) *assesstest.World {
		w := assesstest.NewWorld(at).Versioned(version).Dead("cp-2", stopped.Add(time.Second), "cp-0", "cp-1")
		own := w.Obs.Reports["cp-2"] // its last, from before it stopped: its etcd probe passed
		own.SentAt, own.Version = stopped.Add(-500*time.Millisecond), 1
		w.Obs.Reports["cp-2"] = own
		return w
	}
	for _, tc := range []struct {
		name string
		then func() *assesstest.World // a pass after the one that follows the return
		want quorum.Health
	}{
		{"nothing newer: only its own old word and views from before the return", func() *assesstest.World {
			return world(back.Add(1500*time.Millisecond), 2)
		}, quorum.HealthUnknown},
		{"newer views that do not reach it", func() *assesstest.World { return world(back.Add(1500*time.Millisecond), 3) }, quorum.Unhealthy},
		{"newer views that reach it", func() *assesstest.World {
			return assesstest.NewWorld(back.Add(1500*time.Millisecond)).Versioned(3).Version("cp-2", 1)
		}, quorum.Healthy},
		{"a newer view that reaches it, an older one that does not: no majority", func() *assesstest.World {
			w := world(back.Add(1500*time.Millisecond), 2)
			reaches := assesstest.NewWorld(back.Add(time.Second)).Obs.Reports["cp-0"]
			reaches.Version = 3
			w.Obs.Reports["cp-0"] = reaches
			return w
		}, quorum.HealthUnknown},
		{"its own word newer than the return, its agent heard again", func() *assesstest.World {
			w := world(back.Add(1500*time.Millisecond), 2).Version("cp-2", 3)
			w.Obs.HubPeers["cp-2"] = report.PeerView{Name: "cp-2", State: report.PeerAlive, Since: back.Add(time.Second)}
			r := w.Obs.Reports["cp-2"]
			r.SentAt = back.Add(time.Second)
			w.Obs.Reports["cp-2"] = r
			return w
		}, quorum.Healthy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := assesstest.Hearing(assess.DefaultPolicy())
			got := assesstest.ByName(a.Assess(assesstest.Machines(), nil, world(back.Add(-time.Second), 1).Obs))["m2"]
			require.Equal(t, quorum.Unhealthy, got.EtcdHealth, "before the return: %q", got.Reasons)
			a.QuorumBack(back)
			got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, world(back.Add(500*time.Millisecond), 2).Obs))["m2"]
			assert.Equal(t, quorum.HealthUnknown, got.EtcdHealth, "the pass after the return: %q", got.Reasons)
			assert.Contains(t, joinLines(got.Reasons), "waiting for newer ones")
			got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, tc.then().Obs))["m2"]
			assert.Equal(t, tc.want, got.EtcdHealth, "%q", got.Reasons)
		})
	}
}

// A member whose etcd probe fails while its own status says it follows the leader the other members
// follow is catching up: EtcdCatchUp more before it is Unhealthy, whether or not its raft index moves
// (a member whose streams to the leader are still being dialled again after a partition of silent
// drops applies nothing new and serves no linearizable read), and whether or not it has applied the
// new term's first entry (its status's term is its last applied entry's). Not when it follows another
// leader (or none), when its status did not answer, nor past the bound; the verdict says which.
func TestEtcdCatchUp(t *testing.T) {
	p := assess.DefaultPolicy()
	withRaft := func(w *assesstest.World, node, leader string, term, index uint64) {
		r := w.Obs.Reports[node]
		e := *r.Etcd
		e.LeaderID, e.RaftTerm, e.RaftIndex = leader, term, index
		if leader != "-" {
			e.LocalID = "id-" + node
		}
		r.Etcd = &e
		w.Obs.Reports[node] = r
	}
	for _, tc := range []struct {
		name            string
		leader, others  string // the member's leader ("-": its status did not answer), and the others' (default a1)
		term            uint64 // the member's raft term (the others': 3)
		failing         time.Duration
		want            assess.Verdict
		reasonSubstring string
	}{
		{name: "following the leader at its term: catching up", leader: "a1", term: 3, failing: 15 * time.Second, want: assess.VerdictSuspect,
			reasonSubstring: "catching up (it follows leader a1, as 2 other members do (its last entry applied of raft term 3, theirs of 3; its commit index 180)): 30s more allowed"},
		{name: "following the leader, its entries not applied yet: catching up", leader: "a1", term: 2, failing: 15 * time.Second, want: assess.VerdictSuspect,
			reasonSubstring: "catching up (it follows leader a1, as 2 other members do (its last entry applied of raft term 2, theirs of 3"},
		{name: "another leader: failing", leader: "b2", term: 3, failing: 15 * time.Second, want: assess.VerdictUnhealthy,
			reasonSubstring: "not catching up: it follows leader b2, the others a1"},
		{name: "no leader: failing", leader: "0", term: 3, failing: 15 * time.Second, want: assess.VerdictUnhealthy,
			reasonSubstring: "not catching up: it follows no leader, the others a1"},
		{name: "its status does not answer: failing", leader: "-", term: 3, failing: 15 * time.Second, want: assess.VerdictUnhealthy},
		{name: "past the bound: failing", leader: "a1", term: 3, failing: 41 * time.Second, want: assess.VerdictUnhealthy},
		{name: "only its own word for the leader: failing", leader: "c3", others: "0", term: 3, failing: 15 * time.Second, want: assess.VerdictUnhealthy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := assesstest.T0().Add(time.Hour)
			w := assesstest.NewWorld(now)
			for _, n := range []string{"cp-1", "cp-2"} {
				withRaft(w, n, cmp.Or(tc.others, "a1"), 3, 200)
			}
			a := assesstest.Hearing(p)
			w.Probe("cp-0", "etcd", false, now.Add(-tc.failing))
			withRaft(w, "cp-0", tc.leader, tc.term, 180)
			got := assesstest.ByName(a.Assess(assesstest.Machines(), nil, w.Obs))["m0"]
			assert.Equal(t, tc.want, got.Verdict, "%q", got.Reasons)
			if tc.reasonSubstring != "" {
				assert.Contains(t, got.Reasons[0], tc.reasonSubstring)
			}
		})
	}
}

// After the hub hears a majority again, an observer's "does not answer" counts only from a report newer
// than the one it held then: the views from the partition said cp-2's member did not answer, and cp-2's
// agent stopping right after the heal must not make its healthy voter's machine dead (test/chaos seed 1).
func TestAViewFromBeforeTheHealDoesNotKillAMachine(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	a := assesstest.Hearing(assess.DefaultPolicy())
	cut := assesstest.NewWorld(now.Add(-30*time.Second)).Versioned(1).Cut(now.Add(-time.Minute), "cp-1", "cp-2")
	a.Assess(assesstest.Machines(), nil, cut.Obs)
	require.False(t, assess.Hear(assess.ExpectedOf(assesstest.Machines(), nil), cut.Obs, assess.DefaultPolicy().StaleAfter).Majority())

	// Healed, and cp-2's agent stops at once: the reports the hub holds are from the partition.
	healed := assesstest.NewWorld(now).Versioned(1).Unreachable("etcd-2", "cp-0", "cp-1").AgentDead("cp-2", now, "cp-0", "cp-1")
	got := assesstest.ByName(a.Assess(assesstest.Machines(), nil, healed.Obs))["m2"]
	assert.Equal(t, assess.VerdictSuspect, got.Verdict, "%+v", got)
	assert.Contains(t, joinLines(got.Reasons), "whether its etcd member etcd-2 answers, only reports from before the hub last began to hear a majority")

	// Newer reports: the member answers, so the agent is what is down.
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, assesstest.NewWorld(now.Add(time.Second)).Versioned(2).AgentDead("cp-2", now, "cp-0", "cp-1").Obs))["m2"]
	assert.Equal(t, assess.VerdictSuspect, got.Verdict, "%+v", got)
	assert.Contains(t, joinLines(got.Reasons), "the agent is down, not the machine")

	// Newer reports that it does not answer: the machine is dead.
	got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, assesstest.NewWorld(now.Add(2*time.Second)).Versioned(3).Dead("cp-2", now, "cp-0", "cp-1").Obs))["m2"]
	assert.Equal(t, assess.VerdictUnhealthy, got.Verdict, "%+v", got)
}
