package pass

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/assess/assesstest"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// said lists a Ready's notices as "reason machine" (or the reason alone, about the hub).
func said(rd Ready) []string {
	var out []string
	for _, n := range rd.Notices {
		out = append(out, string(n.Reason)+" "+n.Machine)
	}
	return out
}

func begun(rd Ready) []string {
	var out []string
	for _, b := range rd.Begin {
		out = append(out, b.Machine.Name)
	}
	return out
}

// What a pass says is part of what it decides: each thing once, when it changes, under one reason.
func TestComputeSaysWhatChangedOnce(t *testing.T) {
	type passCase struct {
		edit   func(*scene)
		says   []string // exactly, in order
		begins []string
	}
	dead2 := func(s *scene) { s.dead(2) }
	inFlight := func(machine string) func(*scene) {
		return func(s *scene) {
			s.dead(2)
			s.f.Flights[machine] = Flight{Plan: quorum.Plan{Strategy: quorum.Reboot, Steps: quorum.MustParseSteps("power-cycle etcd-2", "await-healthy etcd-2")}}
		}
	}
	paused := func(s *scene) { s.dead(2); s.f.Paused = "operator alice" }
	suspended := func(s *scene) { s.dead(2); s.f.Suspended = true }
	for _, tc := range []struct {
		name   string
		passes []passCase
	}{
		{name: "verdicts are said when they change; a dead member begins", passes: []passCase{
			{edit: dead2, says: []string{"Healthy m0", "Healthy m1", "Unhealthy m2"}, begins: []string{"m2"}},
			{edit: inFlight("m2")},
			{edit: func(*scene) {}, says: []string{"Healthy m2"}},
		}},
		{name: "paused: held, said once; lifted: begins", passes: []passCase{
			{edit: paused, says: []string{"Healthy m0", "Healthy m1", "Unhealthy m2", "Paused m2"}},
			{edit: paused},
			{edit: paused},
			{edit: dead2, begins: []string{"m2"}},
		}},
		{name: "a hold that changes is said again, under its own reason", passes: []passCase{
			{edit: paused, says: []string{"Healthy m0", "Healthy m1", "Unhealthy m2", "Paused m2"}},
			{edit: suspended, says: []string{"Suspended m2"}},
			{edit: suspended},
			{edit: func(s *scene) { s.dead(2); s.f.Detached["m2"] = Brake{By: "alice"} }, says: []string{"Detached m2"}},
		}},
		{name: "a hold said, then Healthy, then the same hold again: news again", passes: []passCase{
			{edit: paused, says: []string{"Healthy m0", "Healthy m1", "Unhealthy m2", "Paused m2"}},
			{edit: func(s *scene) { s.f.Paused = "operator alice" }, says: []string{"Healthy m2", "Resumed m2"}}, // nothing was done: back by itself
			// Seen alive in the pass before (this world's clock stands still), it is held first for the
			// stall tolerance: news too.
			{edit: paused, says: []string{"Unhealthy m2", "MayResume m2"}},
		}},
		{name: "standing by: not planning, said once; nothing begins", passes: []passCase{
			{edit: func(s *scene) { s.dead(2); s.f.Listen = "standing by: hub h-0 leads" }, says: []string{"Healthy m0", "Healthy m1", "Unhealthy m2", "NotPlanning "}},
			{edit: func(s *scene) { s.dead(2); s.f.Listen = "standing by: hub h-0 leads" }},
			{edit: dead2, begins: []string{"m2"}},
		}},
		{name: "the observer majority lost, then heard again: each said once", passes: []passCase{
			{edit: func(*scene) {}, says: []string{"Healthy m0", "Healthy m1", "Healthy m2"}},
			{edit: func(s *scene) { s.w.Cut(s.f.Now.Add(-time.Minute), "cp-0", "cp-1") }, says: []string{"ObserverMajorityLost ", "NotPlanning "}},
			{edit: func(s *scene) { s.w.Cut(s.f.Now.Add(-time.Minute), "cp-0", "cp-1") }},
			{edit: func(*scene) {}, says: []string{"ObserverMajorityHeard "}},
		}},
		{name: "quorum lost, said; back: nothing decided, said, and the next pass plans", passes: []passCase{
			{edit: func(s *scene) { s.witnesses("w-0", "w-1").dead(1).dead(2); s.f.Paused = "operator alice" },
				says: []string{"Healthy m0", "Unhealthy m1", "Unhealthy m2", "QuorumLost ", "Paused m1", "Paused m2"}},
			{edit: func(s *scene) { s.witnesses("w-0", "w-1").dead(2) }, says: []string{"Healthy m1", "Resumed m1", "QuorumBack "}},
			{edit: func(s *scene) { s.witnesses("w-0", "w-1").dead(2) }, begins: []string{"m2"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := NewState()
			for i, p := range tc.passes {
				s := newScene()
				p.edit(s)
				var rd Ready
				st, rd = Compute(st, s.stepFacts())
				assert.Equal(t, p.says, said(rd), "pass %d says", i)
				assert.Equal(t, p.begins, begun(rd), "pass %d begins", i)
			}
		})
	}
}

// stepFacts completes a scene's facts for a pass of st (the state keeps what the scene would set).
func (s *scene) stepFacts() Facts {
	s.f.Observations = s.w.Obs
	s.f.Hearing = assess.Hear(assess.ExpectedOf(s.f.Inventory.Refs(), s.f.Inventory.Witnesses), s.f.Observations, s.f.Inventory.Policy.Assess.StaleAfter)
	return s.f
}

// TestStepRandomized runs random sequences of passes (members dying and coming back, brakes set and
// lifted, remediations in flight, holds from history, the hub cut off, quorum lost and back) through
// one state, and checks what every pass must never do, whatever came before.
func TestComputeRandomized(t *testing.T) {
	seeds, passes := 300, 40
	if testing.Short() {
		seeds = 50
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		st := NewState()
		for n := range passes {
			s := newScene()
			dead := map[int]bool{}
			for i := range assesstest.Machines() {
				if rng.IntN(3) == 0 {
					dead[i] = true
					s.dead(i)
				}
			}
			if rng.IntN(4) == 0 {
				s.witnesses("w-0", "w-1")
			}
			switch rng.IntN(8) {
			case 0:
				s.f.Paused = "operator alice"
			case 1:
				s.f.Suspended = true
			case 2:
				s.f.Listen = "standing by"
			case 3:
				s.w.Cut(s.f.Now.Add(-time.Minute), "cp-0", "cp-1")
			}
			for i := range assesstest.Machines() {
				m := assesstest.Machines()[i].Name
				switch rng.IntN(10) {
				case 0:
					s.f.Detached[m] = Brake{By: "alice"}
				case 1:
					s.f.Flights[m] = Flight{Plan: quorum.Plan{Strategy: quorum.Reboot, Steps: quorum.MustParseSteps(fmt.Sprintf("power-cycle etcd-%d", i), fmt.Sprintf("await-healthy etcd-%d", i))}}
				case 2:
					if dead[i] {
						s.remediated(i, "reboot", journal.Failed, 10*time.Minute, 1+rng.IntN(3))
					}
				}
			}
			s.f.RecentStarts = rng.IntN(4)
			f := s.stepFacts()
			before := cloneState(st)
			next, rd := Compute(st, f)
			where := fmt.Sprintf("seed %d pass %d", seed, n)
			require.Equal(t, before, st, "%s: the state a pass starts from is not changed", where)
			again, rdAgain := Compute(st, f)
			require.Equal(t, rd, rdAgain, "%s: the same state and facts, the same Ready", where)
			require.Equal(t, next, again, "%s: the same state and facts, the same state after", where)
			st = next

			if f.Paused != "" || f.Suspended || f.Listen != "" || !f.Hearing.Majority() || !rd.QuorumBack.IsZero() {
				require.Empty(t, rd.Begin, "%s: nothing begins while paused, suspended, listening, without a majority or at a quorum return", where)
			}
			require.LessOrEqual(t, len(rd.Begin), max(0, f.Inventory.Policy.RateMax-f.RecentStarts), "%s: the rate limit", where)
			for _, b := range rd.Begin {
				_, inFlight := f.Flights[b.Machine.Name]
				require.False(t, inFlight, "%s: %s begun while in flight", where, b.Machine.Name)
				_, held := st.View.Holds[b.Machine.Name]
				require.False(t, held, "%s: %s both begun and held", where, b.Machine.Name)
			}
			for _, nt := range rd.Notices {
				require.NotEmpty(t, nt.Reason, "%s: a notice without a reason: %q", where, nt.Message)
				h, isHold := st.View.Holds[nt.Machine]
				if nt.Machine == "" || !isHold || nt.Reason != h.Reason {
					continue
				}
				require.NotEqual(t, before.saidHold[nt.Machine], Hold{Reason: h.Reason, Why: h.Why}, "%s: %s's hold said again unchanged", where, nt.Machine)
			}
			for m, h := range st.View.Holds {
				require.NotEmpty(t, h.Reason, "%s: %s held without a reason", where, m)
				if st.saidHold[m] != (Hold{Reason: h.Reason, Why: h.Why}) && rd.QuorumBack.IsZero() && f.Listen == "" {
					t.Fatalf("%s: %s is held (%s: %s) and that was never said", where, m, h.Reason, h.Why)
				}
			}
		}
	}
}

// cloneState is a deep copy of s.
func cloneState(s State) State {
	c := s
	c.unhealthyAt, c.healthyAt, c.seenAt = maps.Clone(s.unhealthyAt), maps.Clone(s.healthyAt), maps.Clone(s.seenAt)
	c.lifeAt, c.episodes, c.watched = maps.Clone(s.lifeAt), maps.Clone(s.episodes), slices.Clone(s.watched)
	c.beginFailed, c.saidHold = maps.Clone(s.beginFailed), maps.Clone(s.saidHold)
	if s.saidMajority != nil {
		b := *s.saidMajority
		c.saidMajority = &b
	}
	c.kept.Agents, c.kept.Witnesses = slices.Clone(s.kept.Agents), slices.Clone(s.kept.Witnesses)
	return c
}

// A loss of etcd's quorum that the latest pass that planned saw stands for degraded mode's test
// (EtcdQuorum) though a pass since heard no majority of its observers: on the real kubeadm cluster,
// two of three nodes frozen, a witness missed a probe as the Lease was lost, and no replica went on
// alone. A loss seen before `after` does not count; a pass since that planned and saw quorum is what
// counts; and the pass of quorum's return decides nothing.
func TestEtcdQuorumKeepsTheLossThePlanningPassSaw(t *testing.T) {
	lost := func() *scene { return newScene().witnesses("w-0", "w-1").dead(1).dead(2) }
	st := NewState()
	var rd Ready
	s1 := lost()
	st, rd = Compute(st, s1.stepFacts())
	require.True(t, st.View.quorumLost, "%v", said(rd))
	v := st.View
	q, why := v.EtcdQuorum(s1.f.Now.Add(-time.Second))
	require.Equal(t, QuorumLost, q, why)

	s2 := lost()
	s2.f.Now = s1.f.Now.Add(200 * time.Millisecond)
	s2.w.Cut(s2.f.Now.Add(-time.Second), "w-1")
	st, rd = Compute(st, s2.stepFacts())
	require.False(t, st.View.Hearing.Majority(), "%v", said(rd))
	v = st.View
	q, why = v.EtcdQuorum(s1.f.Now.Add(-time.Second))
	assert.Equal(t, QuorumLost, q, "the loss the planning pass saw stands: %s", why)
	assert.Contains(t, why, "since then: ")
	q, _ = v.EtcdQuorum(s1.f.Now)
	assert.Equal(t, QuorumUnknown, q, "seen before after: it does not count")

	s3 := newScene().witnesses("w-0", "w-1").dead(2)
	s3.f.Now = s2.f.Now.Add(200 * time.Millisecond)
	st, rd = Compute(st, s3.stepFacts())
	require.False(t, rd.QuorumBack.IsZero(), "%v", said(rd))
	v = st.View
	q, why = v.EtcdQuorum(s1.f.Now.Add(-time.Second))
	assert.Equal(t, QuorumUnknown, q, "quorum's return decides nothing: %s", why)
}

// The view names the planned work on every machine that has some, healthy or not, and no longer once
// it is done; a view published before is not changed by a later pass.
func TestViewKeepsThePlannedWork(t *testing.T) {
	s := newScene()
	s.f.Inventory.Machines[1].PlannedWork = "Node cp-1 is cordoned"
	st, _ := Compute(NewState(), s.stepFacts())
	first := st.View
	assert.Equal(t, map[string]string{"m1": "Node cp-1 is cordoned"}, first.PlannedWork)
	assert.Equal(t, assess.VerdictHealthy, AssessmentOf(first.Assessments, 1, "m1").Verdict, "shown while healthy")
	st, _ = Compute(st, newScene().stepFacts())
	assert.Empty(t, st.View.PlannedWork, "done: no longer shown")
	assert.Equal(t, map[string]string{"m1": "Node cp-1 is cordoned"}, first.PlannedWork, "the published view unchanged")
}
