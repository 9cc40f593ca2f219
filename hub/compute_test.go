package hub

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
		out = append(out, b.machine.Name)
	}
	return out
}

// What a pass says is part of what it decides: each thing once, when it changes, under one reason.
func TestComputeSaysWhatChangedOnce(t *testing.T) {
	type pass struct {
		edit   func(*scene)
		says   []string // exactly, in order
		begins []string
	}
	dead2 := func(s *scene) { s.dead(2) }
	inFlight := func(machine string) func(*scene) {
		return func(s *scene) {
			s.dead(2)
			s.f.flights[machine] = flight{plan: quorum.Plan{Strategy: quorum.Reboot, Steps: steps("power-cycle etcd-2", "await-healthy etcd-2")}}
		}
	}
	paused := func(s *scene) { s.dead(2); s.f.paused = "operator alice" }
	suspended := func(s *scene) { s.dead(2); s.f.suspended = true }
	for _, tc := range []struct {
		name   string
		passes []pass
	}{
		{name: "verdicts are said when they change; a dead member begins", passes: []pass{
			{edit: dead2, says: []string{"Healthy m0", "Healthy m1", "Unhealthy m2"}, begins: []string{"m2"}},
			{edit: inFlight("m2")},
			{edit: func(*scene) {}, says: []string{"Healthy m2"}},
		}},
		{name: "paused: held, said once; lifted: begins", passes: []pass{
			{edit: paused, says: []string{"Healthy m0", "Healthy m1", "Unhealthy m2", "Paused m2"}},
			{edit: paused},
			{edit: paused},
			{edit: dead2, begins: []string{"m2"}},
		}},
		{name: "a hold that changes is said again, under its own reason", passes: []pass{
			{edit: paused, says: []string{"Healthy m0", "Healthy m1", "Unhealthy m2", "Paused m2"}},
			{edit: suspended, says: []string{"Suspended m2"}},
			{edit: suspended},
			{edit: func(s *scene) { s.dead(2); s.f.detached["m2"] = Brake{By: "alice"} }, says: []string{"Detached m2"}},
		}},
		{name: "a hold said, then Healthy, then the same hold again: news again", passes: []pass{
			{edit: paused, says: []string{"Healthy m0", "Healthy m1", "Unhealthy m2", "Paused m2"}},
			{edit: func(s *scene) { s.f.paused = "operator alice" }, says: []string{"Healthy m2"}},
			{edit: paused, says: []string{"Unhealthy m2", "Paused m2"}},
		}},
		{name: "standing by: not planning, said once; nothing begins", passes: []pass{
			{edit: func(s *scene) { s.dead(2); s.f.listen = "standing by: hub h-0 leads" }, says: []string{"Healthy m0", "Healthy m1", "Unhealthy m2", "NotPlanning "}},
			{edit: func(s *scene) { s.dead(2); s.f.listen = "standing by: hub h-0 leads" }},
			{edit: dead2, begins: []string{"m2"}},
		}},
		{name: "the observer majority lost, then heard again: each said once", passes: []pass{
			{edit: func(*scene) {}, says: []string{"Healthy m0", "Healthy m1", "Healthy m2"}},
			{edit: func(s *scene) { s.w.Cut(s.f.now.Add(-time.Minute), "cp-0", "cp-1") }, says: []string{"ObserverMajorityLost ", "NotPlanning "}},
			{edit: func(s *scene) { s.w.Cut(s.f.now.Add(-time.Minute), "cp-0", "cp-1") }},
			{edit: func(*scene) {}, says: []string{"ObserverMajorityHeard "}},
		}},
		{name: "quorum lost, said; back: nothing decided, said, and the next pass plans", passes: []pass{
			{edit: func(s *scene) { s.witnesses("w-0", "w-1").dead(1).dead(2); s.f.paused = "operator alice" },
				says: []string{"Healthy m0", "Unhealthy m1", "Unhealthy m2", "QuorumLost ", "Paused m1", "Paused m2"}},
			{edit: func(s *scene) { s.witnesses("w-0", "w-1").dead(2) }, says: []string{"Healthy m1", "QuorumBack "}},
			{edit: func(s *scene) { s.witnesses("w-0", "w-1").dead(2) }, begins: []string{"m2"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newPassState()
			for i, p := range tc.passes {
				s := newScene()
				p.edit(s)
				var rd Ready
				st, rd = compute(st, s.stepFacts())
				assert.Equal(t, p.says, said(rd), "pass %d says", i)
				assert.Equal(t, p.begins, begun(rd), "pass %d begins", i)
			}
		})
	}
}

// stepFacts completes a scene's facts for a pass of st (the state keeps what the scene would set).
func (s *scene) stepFacts() facts {
	s.f.obs = s.w.Obs
	s.f.hearing = assess.Hear(assess.ExpectedOf(refs(s.f.inv), s.f.inv.Witnesses), s.f.obs, s.f.inv.Policy.Assess.StaleAfter)
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
		st := newPassState()
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
				s.f.paused = "operator alice"
			case 1:
				s.f.suspended = true
			case 2:
				s.f.listen = "standing by"
			case 3:
				s.w.Cut(s.f.now.Add(-time.Minute), "cp-0", "cp-1")
			}
			for i := range assesstest.Machines() {
				m := assesstest.Machines()[i].Name
				switch rng.IntN(10) {
				case 0:
					s.f.detached[m] = Brake{By: "alice"}
				case 1:
					s.f.flights[m] = flight{plan: quorum.Plan{Strategy: quorum.Reboot, Steps: steps(fmt.Sprintf("power-cycle etcd-%d", i), fmt.Sprintf("await-healthy etcd-%d", i))}}
				case 2:
					if dead[i] {
						s.remediated(i, "reboot", journal.Failed, 10*time.Minute, 1+rng.IntN(3))
					}
				}
			}
			s.f.recentStarts = rng.IntN(4)
			f := s.stepFacts()
			before := cloneState(st)
			next, rd := compute(st, f)
			where := fmt.Sprintf("seed %d pass %d", seed, n)
			require.Equal(t, before, st, "%s: the state a pass starts from is not changed", where)
			again, rdAgain := compute(st, f)
			require.Equal(t, rd, rdAgain, "%s: the same state and facts, the same Ready", where)
			require.Equal(t, next, again, "%s: the same state and facts, the same state after", where)
			st = next

			if f.paused != "" || f.suspended || f.listen != "" || !f.hearing.Majority() || !rd.QuorumBack.IsZero() {
				require.Empty(t, rd.Begin, "%s: nothing begins while paused, suspended, listening, without a majority or at a quorum return", where)
			}
			require.LessOrEqual(t, len(rd.Begin), max(0, f.inv.Policy.RateMax-f.recentStarts), "%s: the rate limit", where)
			for _, b := range rd.Begin {
				_, inFlight := f.flights[b.machine.Name]
				require.False(t, inFlight, "%s: %s begun while in flight", where, b.machine.Name)
				_, held := st.view.holds[b.machine.Name]
				require.False(t, held, "%s: %s both begun and held", where, b.machine.Name)
			}
			for _, nt := range rd.Notices {
				require.NotEmpty(t, nt.Reason, "%s: a notice without a reason: %q", where, nt.Message)
				h, isHold := st.view.holds[nt.Machine]
				if nt.Machine == "" || !isHold || nt.Reason != h.reason {
					continue
				}
				require.NotEqual(t, before.saidHold[nt.Machine], hold{reason: h.reason, why: h.why}, "%s: %s's hold said again unchanged", where, nt.Machine)
			}
			for m, h := range st.view.holds {
				require.NotEmpty(t, h.reason, "%s: %s held without a reason", where, m)
				if st.saidHold[m] != (hold{reason: h.reason, why: h.why}) && rd.QuorumBack.IsZero() && f.listen == "" {
					t.Fatalf("%s: %s is held (%s: %s) and that was never said", where, m, h.reason, h.why)
				}
			}
		}
	}
}

// cloneState is a deep copy of s.
func cloneState(s passState) passState {
	c := s
	c.unhealthyAt, c.healthyAt, c.seenAt = maps.Clone(s.unhealthyAt), maps.Clone(s.healthyAt), maps.Clone(s.seenAt)
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
	st := newPassState()
	var rd Ready
	s1 := lost()
	st, rd = compute(st, s1.stepFacts())
	require.True(t, st.view.quorumLost, "%v", said(rd))
	h := &Hub{view: st.view}
	q, why := h.EtcdQuorum(s1.f.now.Add(-time.Second))
	require.Equal(t, QuorumLost, q, why)

	s2 := lost()
	s2.f.now = s1.f.now.Add(200 * time.Millisecond)
	s2.w.Cut(s2.f.now.Add(-time.Second), "w-1")
	st, rd = compute(st, s2.stepFacts())
	require.False(t, st.view.hearing.Majority(), "%v", said(rd))
	h.view = st.view
	q, why = h.EtcdQuorum(s1.f.now.Add(-time.Second))
	assert.Equal(t, QuorumLost, q, "the loss the planning pass saw stands: %s", why)
	assert.Contains(t, why, "since then: ")
	q, _ = h.EtcdQuorum(s1.f.now)
	assert.Equal(t, QuorumUnknown, q, "seen before after: it does not count")

	s3 := newScene().witnesses("w-0", "w-1").dead(2)
	s3.f.now = s2.f.now.Add(200 * time.Millisecond)
	st, rd = compute(st, s3.stepFacts())
	require.False(t, rd.QuorumBack.IsZero(), "%v", said(rd))
	h.view = st.view
	q, why = h.EtcdQuorum(s1.f.now.Add(-time.Second))
	assert.Equal(t, QuorumUnknown, q, "quorum's return decides nothing: %s", why)
}
