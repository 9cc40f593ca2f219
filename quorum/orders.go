package quorum

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// This file checks remediations that run at the same time against every order their steps can take.
// Each remediation's steps run in their own order, but nothing orders the steps of two remediations:
// a reboot's power-cycle may come before or after a replace's promote. A start is safe only when it is
// safe in every such order (interleaving) with the steps still to come of every remediation already in
// flight, and with everything else the same pass starts.
//
// The state after some steps of each remediation does not depend on the order they were taken in
// (each step touches its own member, and a member held down by one remediation is not brought back by
// another's await), so the orders are explored as a lattice of progress vectors, one step count per
// remediation, instead of one order at a time: a few thousand states where the orders would be
// millions.

// track is one remediation's steps still to come, in order.
type track struct {
	machine  string
	strategy Strategy
	// member is the machine's own etcd member: a disruption of it that the cluster already shows (a
	// reboot in flight) is this track's doing, and this track's await of it ends it.
	member string
	steps  []Step
	// fresh: started by this pass, not in flight before it.
	fresh bool
}

// maxOrderStates bounds the states explored for one start; past it the start waits, unproven.
const maxOrderStates = 1 << 16

// OrderRefusal says why a plan is unsafe beside work in flight: in one order of the steps still to
// come, one step takes the healthy voters below where etcd's rules allow.
type OrderRefusal struct {
	// Plan is the plan that was refused.
	Plan Plan
	// Before lists the steps taken before the breaking one, in that order, each with its machine.
	Before []OrderStep
	// Breaking is the step that breaks the rule, and Reason its refusal with the numbers.
	Breaking OrderStep
	Reason   *Refusal
	// TooMany: the remediations running together have more orders than are checked
	// (maxOrderStates): the plan was not proven unsafe, only not proven safe.
	TooMany bool
}

// OrderStep is one step in an order, with the machine whose remediation takes it.
type OrderStep struct {
	Machine  string
	Strategy Strategy
	Step     Step
}

func (o OrderStep) whose() string { return o.Machine + "'s " + o.Strategy.String() }

func (r *OrderRefusal) Error() string {
	what := r.Plan.Steps[0].describe()
	if r.TooMany {
		return fmt.Sprintf("%s waits: with the remediations in flight, its steps can run in more than %d orders, too many to check them all", what, maxOrderStates)
	}
	// Runs of steps by one remediation: "await-healthy etcd-3 → promote etcd-3 (cp-1's replace)".
	var runs []string
	for i := 0; i < len(r.Before); {
		j, steps := i, []string{}
		for ; j < len(r.Before) && r.Before[j].Machine == r.Before[i].Machine; j++ {
			steps = append(steps, r.Before[j].Step.String())
		}
		runs = append(runs, strings.Join(steps, " → ")+" ("+r.Before[i].whose()+")")
		i = j
	}
	order := "first"
	if len(runs) > 0 {
		order = "after " + strings.Join(runs, " → ")
	}
	breaking, rest, _ := strings.Cut(r.Reason.Error(), " "+r.Breaking.Step.Member)
	return fmt.Sprintf("%s is unsafe beside the work in flight: in one order of their steps, %s, %s %s (%s)%s",
		what, order, breaking, r.Breaking.Step.Member, r.Breaking.whose(), rest)
}

// materialize returns the cluster after the first prog[i] steps of each track. With onlyRecoveries,
// fresh tracks contribute only their awaits' recoveries of members the cluster already had, not their
// disruptions or membership changes: the work in flight as it would be without what the pass starts,
// beyond the members it brings back.
func materialize(base Cluster, tracks []track, prog []int, onlyRecoveries bool) []Member {
	ms := make([]Member, len(base.Members), len(base.Members)+len(tracks))
	copy(ms, base.Members)
	// Per member, by position in ms: brought back, its shown disruption ended by its own track's
	// await, held down by a track's power step, removed.
	type marks struct {
		cameBack, released, removed bool
		held                        Disruption
	}
	var buf [16]marks
	mk := append(buf[:0], make([]marks, len(ms))...)
	for i, t := range tracks {
		done := t.steps[:prog[i]]
		for _, s := range done {
			j := Cluster{ms}.Index(s.Member)
			if onlyRecoveries && t.fresh {
				if s.Op == OpAwaitHealthy && j >= 0 && j < len(base.Members) {
					mk[j].cameBack = true
				}
				continue
			}
			switch s.Op {
			case OpAddLearner, OpAddVoter:
				ms = append(ms, Member{Name: s.Member, Learner: s.Op == OpAddLearner, Health: Unhealthy})
				mk = append(mk, marks{})
			case OpPromote:
				if j >= 0 {
					ms[j].Learner = false
				}
			case OpRemove:
				if j >= 0 {
					mk[j].removed = true
				}
			case OpPowerCycle, OpPowerOff:
				if d := holding(done, s.Member); j >= 0 && d > mk[j].held {
					mk[j].held = d
				}
			case OpAwaitHealthy:
				if j >= 0 {
					mk[j].cameBack = true
					mk[j].released = mk[j].released || s.Member == t.member
				}
			}
		}
	}
	out := ms[:0]
	for j, m := range ms {
		if mk[j].removed {
			continue
		}
		if mk[j].cameBack {
			m.Health = Healthy
		}
		if mk[j].released {
			m.Disruption = NotDisrupted
		}
		if d := mk[j].held; d > m.Disruption {
			m.Disruption = d
		}
		out = append(out, m)
	}
	return out
}

// holding is how steps leave member: held down by a power-cycle not yet awaited (InFlight), powered
// off (Fenced), or not held (NotDisrupted).
func holding(steps []Step, member string) Disruption {
	d := NotDisrupted
	for _, s := range steps {
		if s.Member != member {
			continue
		}
		switch s.Op {
		case OpPowerCycle:
			d = InFlight
		case OpPowerOff:
			d = Fenced
		case OpAwaitHealthy:
			d = NotDisrupted
		}
	}
	return d
}

// heldElsewhere reports whether a track other than ti holds member down: by its own steps so far, or
// by a disruption the cluster already showed that is its doing and that it has not ended yet.
func heldElsewhere(base Cluster, tracks []track, prog []int, ti int, member string) bool {
	for j, t := range tracks {
		if j == ti {
			continue
		}
		done := t.steps[:prog[j]]
		if holding(done, member) != NotDisrupted {
			return true
		}
		if k := base.Index(member); k >= 0 && t.member == member && base.Members[k].Disruption != NotDisrupted &&
			!slices.Contains(done, Step{OpAwaitHealthy, member}) {
			return true
		}
	}
	return false
}

// stepResult is what one track's next step does from one state.
type stepResult struct {
	blocked bool // it cannot happen from here (etcd refuses it, or its member is not there or not back)
	hazard  *Refusal
	afterFT int
}

// tryStep says what track t's step s does from ms: blocked, a hazard (it lowers the fault tolerance
// below 0 or the policy's headroom), or fine.
func tryStep(base Cluster, ms []Member, p Policy, tracks []track, prog []int, ti int, s Step) stepResult {
	if s.Op == OpAwaitHealthy {
		// Not back while gone, powered off for good (by no remediation of its own), or held down by
		// another remediation that has not brought it back yet.
		i := Cluster{ms}.Index(s.Member)
		if i < 0 || ms[i].Disruption == Fenced && s.Member != tracks[ti].member || heldElsewhere(base, tracks, prog, ti, s.Member) {
			return stepResult{blocked: true}
		}
		return stepResult{}
	}
	scratch := make([]Member, len(ms), len(ms)+1)
	copy(scratch, ms)
	_, after, err := checkStep(scratch, p, s)
	if err == nil {
		return stepResult{afterFT: after.FaultTolerance}
	}
	if r, ok := err.(*Refusal); ok && (r.Violation == BelowQuorum || r.Violation == BelowFaultTolerance) {
		return stepResult{hazard: r, afterFT: r.After.FaultTolerance}
	}
	return stepResult{blocked: true}
}

// checkOrders explores every order of the tracks' steps from base. A step of a fresh track may never
// be a hazard. A step of a track in flight may be one only where it is one anyway without the fresh
// tracks (their awaits kept: bringing a member back is never blamed) and they do not make it worse:
// the planner does not answer for the work in flight, which the executor re-checks, but it never
// starts anything that makes that work unsafe. The refusal names the order that breaks.
func checkOrders(base Cluster, p Policy, tracks []track, plan Plan) error {
	if len(tracks) == 1 && tracks[0].fresh {
		return nil // its own order only: what PlanFor already simulated from base
	}
	radix := make([]int, len(tracks))
	total := 1
	for i, t := range tracks {
		radix[i] = len(t.steps) + 1
		total *= radix[i]
		if total > maxOrderStates {
			return &OrderRefusal{Plan: plan, TooMany: true}
		}
	}
	decode := func(v int, prog []int) {
		for i := range prog {
			prog[i] = v % radix[i]
			v /= radix[i]
		}
	}
	stride := make([]int, len(tracks))
	for i, s := 0, 1; i < len(tracks); i++ {
		stride[i], s = s, s*radix[i]
	}
	parent := make([]int32, total) // how each state was first reached: -1 unreached, else track index
	for i := range parent {
		parent[i] = -1
	}
	parent[0] = int32(len(tracks)) // the start
	queue := []int{0}
	prog := make([]int, len(tracks))
	scratch := make([]int, len(tracks))
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		decode(v, prog)
		ms := materialize(base, tracks, prog, false)
		for ti, t := range tracks {
			if prog[ti] == len(t.steps) {
				continue
			}
			s := t.steps[prog[ti]]
			res := tryStep(base, ms, p, tracks, prog, ti, s)
			if res.blocked {
				continue
			}
			if res.hazard != nil && (t.fresh || !excused(base, p, tracks, prog, scratch, ti, s, res)) {
				return &OrderRefusal{Plan: plan, Before: orderTo(v, parent, stride, radix, tracks), Breaking: OrderStep{t.machine, t.strategy, s}, Reason: res.hazard}
			}
			if next := v + stride[ti]; parent[next] < 0 {
				parent[next] = int32(ti)
				queue = append(queue, next)
			}
		}
	}
	return nil
}

// excused: track ti's step s, a hazard with everything so far, is one anyway with the fresh tracks'
// work left out (their recoveries kept), and no better there.
func excused(base Cluster, p Policy, tracks []track, prog, scratch []int, ti int, s Step, res stepResult) bool {
	copy(scratch, prog)
	without := materialize(base, tracks, scratch, true)
	for i, t := range tracks {
		if t.fresh {
			scratch[i] = 0 // fresh tracks hold nothing down in that world
		}
	}
	alt := tryStep(base, without, p, tracks, scratch, ti, s)
	return alt.hazard != nil && res.afterFT >= alt.afterFT
}

// orderTo rebuilds the steps that first reached state v.
func orderTo(v int, parent []int32, stride, radix []int, tracks []track) []OrderStep {
	var rev []OrderStep
	for v != 0 {
		ti := int(parent[v])
		v -= stride[ti]
		n := (v / stride[ti]) % radix[ti]
		rev = append(rev, OrderStep{tracks[ti].machine, tracks[ti].strategy, tracks[ti].steps[n]})
	}
	out := make([]OrderStep, len(rev))
	for i := range rev {
		out[i] = rev[len(rev)-1-i]
	}
	return out
}

// Remaining returns the steps of a remediation of strategy s on member that are still to come, as far
// as the membership c shows: after the last step c shows done (a member added, a learner promoted, the
// old member removed). Power steps and awaits leave no trace in the membership, so a reboot's or
// fence's steps are all still to come, the conservative reading.
func (c Cluster) Remaining(steps []Step) []Step {
	from := 0
	for i, s := range steps {
		j := c.Index(s.Member)
		done := false
		switch s.Op {
		case OpAddLearner, OpAddVoter:
			done = j >= 0
		case OpPromote:
			done = j >= 0 && !c.Members[j].Learner
		case OpRemove:
			done = j < 0
		}
		if done {
			from = i + 1
		}
	}
	return steps[from:]
}

// inFlightTracks are the steps still to come of the etcd members' remediations in flight among ms.
func inFlightTracks(c Cluster, ms []Machine) []track {
	var tracks []track
	for i := range ms {
		m := &ms[i]
		if !m.InFlight || m.Member == "" {
			continue
		}
		if steps := inFlightSteps(c, m); len(steps) > 0 {
			tracks = append(tracks, track{machine: m.Name, strategy: m.Strategy, member: m.Member, steps: steps})
		}
	}
	return tracks
}

// freshTrack is plan, for m, about to start.
func freshTrack(m *Machine, plan Plan) track {
	return track{machine: m.Name, strategy: m.Strategy, member: m.Member, steps: plan.Steps, fresh: true}
}

// inFlightSteps is what an in-flight machine still has to do: its Remaining when given, else its
// strategy's steps from the start; in both cases after what the membership shows done.
func inFlightSteps(c Cluster, m *Machine) []Step {
	steps := m.Remaining
	if steps == nil {
		shape := Shape{Order: ScaleUpFirst, Join: cmp.Or(m.Replace.Join, JoinAsLearner)}
		if len(m.Replace.Orders) > 0 {
			shape.Order = m.Replace.Orders[0]
		}
		if m.Strategy == Reboot || m.Strategy == Fence || m.Strategy == Replace && m.Replace.NewMember != "" {
			steps = m.Strategy.steps(m.Member, m.Replace.NewMember, shape)
		}
	}
	return c.Remaining(steps)
}

// PlanBeside plans m's strategy for its member like PlanFor, and also checks the plan in every order of its
// steps with the steps still to come of the machines in flight (their Remaining, as in PlanPass): what
// a request made outside a planning pass (an operator's reboot) must pass. c is the membership as
// observed, with the members of reboots and fences in flight marked InFlight.
func (c Cluster) PlanBeside(p Policy, m Machine, inFlight []Machine) (Plan, error) {
	plan, err := c.PlanFor(p, m.Strategy, m.Member, m.Replace)
	if err != nil {
		return plan, err
	}
	tracks := append(inFlightTracks(c, inFlight), freshTrack(&m, plan))
	if err := checkOrders(c, p, tracks, plan); err != nil {
		return Plan{}, err
	}
	return plan, nil
}
