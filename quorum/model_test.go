package quorum

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// This file model-checks the planner against a slow, obvious reference written separately from the
// package: its own quorum arithmetic, its own step semantics, its own reading of the rules.
//
// It enumerates every cluster of 1..7 voters and 0..1 learners over every member state (3 healths ×
// 3 disruptions), every target member, every strategy (reboot, fence, replace with every order
// preference and join mode) and several policies, and for each:
//   - if the package returns a plan, it walks every step with the reference and asserts the invariant
//     (healthy voters ≥ quorum whenever they were before the step; learners never counted; the last
//     voter never removed; membership never changed without quorum; the learner limit and the policy's
//     headroom kept), that the plan is the first safe shape in the owner's preference order, and that
//     its cost is right;
//   - if the package refuses, it asserts the refusal names a real violation (with the right numbers) at
//     a real step, and that the reference finds no safe shape either (no needless refusal).
//
// Members are interchangeable apart from their state, so voters are enumerated as multisets of states
// and one target is taken per distinct state: every assignment of states to members is covered up to
// renaming.

type refMember struct {
	name       string
	learner    bool
	health     Health
	disruption Disruption
}

// refCluster is the reference's cluster: a value, so that applying a step copies it without allocating.
type refCluster struct {
	n int
	m [9]refMember
}

func (rc refCluster) list() []refMember { return rc.m[:rc.n] }

func (rc refCluster) String() string { return fmt.Sprint(rc.list()) }

func refQuorum(voters int) int {
	k := 0
	for 2*k <= voters {
		k++
	}
	return k
}

func refCounts(ms refCluster) (voters, healthy, learners int) {
	for _, m := range ms.list() {
		switch {
		case m.learner:
			learners++
		default:
			voters++
			if m.health == Healthy && m.disruption == NotDisrupted {
				healthy++
			}
		}
	}
	return
}

func refFaultTolerance(ms refCluster) int {
	v, h, _ := refCounts(ms)
	return h - refQuorum(v)
}

func refFind(ms refCluster, name string) int {
	for i, m := range ms.list() {
		if m.name == name {
			return i
		}
	}
	return -1
}

// refApply is the reference's reading of each step, worst case at the moment it is taken.
func refApply(ms refCluster, s Step) refCluster {
	out := ms
	i := refFind(out, s.Member)
	switch s.Op {
	case OpAddLearner, OpAddVoter:
		out.m[out.n] = refMember{name: s.Member, learner: s.Op == OpAddLearner, health: Unhealthy}
		out.n++
	case OpRemove:
		copy(out.m[i:], out.m[i+1:out.n])
		out.n--
		out.m[out.n] = refMember{}
	case OpPowerCycle:
		out.m[i].disruption = InFlight
	case OpPowerOff:
		out.m[i].disruption = Fenced
	case OpAwaitHealthy:
		out.m[i].health, out.m[i].disruption = Healthy, NotDisrupted
	case OpPromote:
		out.m[i].learner = false
	}
	return out
}

func isMembership(o Op) bool {
	return o == OpAddLearner || o == OpAddVoter || o == OpPromote || o == OpRemove
}

// refHolds says whether violation v really applies to step s from ms under p.
func refHolds(v Violation, ms refCluster, s Step, p Policy) bool {
	voters, healthy, learners := refCounts(ms)
	i := refFind(ms, s.Member)
	switch v {
	case QuorumLost:
		return isMembership(s.Op) && healthy < refQuorum(voters)
	case LastVoter:
		return s.Op == OpRemove && i >= 0 && !ms.m[i].learner && voters == 1
	case LearnerNotReady:
		return s.Op == OpPromote && i >= 0 && ms.m[i].learner && !(ms.m[i].health == Healthy && ms.m[i].disruption == NotDisrupted)
	case LearnerLimit:
		return s.Op == OpAddLearner && learners >= p.MaxLearners
	case BelowQuorum, BelowFaultTolerance:
		before, after := refFaultTolerance(ms), refFaultTolerance(refApply(ms, s))
		if v == BelowQuorum {
			return after < before && after < 0
		}
		return after < before && after < p.MinFaultTolerance
	}
	return false
}

// refSafe says whether any rule forbids step s from ms to next (= refApply(ms, s)).
func refSafe(ms, next refCluster, s Step, p Policy) bool {
	for _, v := range []Violation{QuorumLost, LastVoter, LearnerNotReady, LearnerLimit} {
		if refHolds(v, ms, s, p) {
			return false
		}
	}
	before, after := refFaultTolerance(ms), refFaultTolerance(next)
	return after >= before || (after >= 0 && after >= p.MinFaultTolerance)
}

// refShapes lists the step sequences the package may use for a request, most preferred first.
func refShapes(strategy Strategy, target, fresh string, orders []Order, join Join) [][]Step {
	switch strategy {
	case Reboot:
		return [][]Step{{{OpPowerCycle, target}, {OpAwaitHealthy, target}}}
	case Fence:
		return [][]Step{{{OpPowerOff, target}}}
	}
	var out [][]Step
	for _, o := range orders {
		var add []Step
		if join == JoinAsLearner {
			add = []Step{{OpAddLearner, fresh}, {OpAwaitHealthy, fresh}, {OpPromote, fresh}}
		} else {
			add = []Step{{OpAddVoter, fresh}, {OpAwaitHealthy, fresh}}
		}
		rm := Step{OpRemove, target}
		if o == ScaleUpFirst {
			out = append(out, append(add, rm))
		} else {
			out = append(out, append([]Step{rm}, add...))
		}
	}
	return out
}

// refWorlds are the clusters a plan on target must be safe in: ms, and when target is a voter of
// unknown health that nothing is disrupting, first ms with it healthy (the world where acting on it
// costs a healthy voter).
func refWorlds(ms refCluster, target string) []refCluster {
	i := refFind(ms, target)
	if i < 0 || ms.m[i].learner || ms.m[i].health != HealthUnknown || ms.m[i].disruption != NotDisrupted {
		return []refCluster{ms}
	}
	up := ms
	up.m[i].health = Healthy
	return []refCluster{up, ms}
}

// refWalkWorlds returns whether steps are safe in every world of target, and the highest cost.
func refWalkWorlds(ms refCluster, target string, steps []Step, p Policy) (bool, int) {
	cost := 0
	for _, w := range refWorlds(ms, target) {
		ok, c := refWalk(w, steps, p)
		if !ok {
			return false, 0
		}
		cost = max(cost, c)
	}
	return true, cost
}

// refWalk returns whether every step of steps is safe from ms, and the reference cost.
func refWalk(ms refCluster, steps []Step, p Policy) (bool, int) {
	start := refFaultTolerance(ms)
	lowest := start
	for _, s := range steps {
		next := refApply(ms, s)
		if !refSafe(ms, next, s, p) {
			return false, 0
		}
		ms = next
		lowest = min(lowest, refFaultTolerance(ms))
	}
	return true, start - lowest
}

// modelCase is one request: a cluster, a target, a strategy with the owner's replace options, and the
// shapes the package may use for it, most preferred first.
type modelCase struct {
	ms       refCluster
	cl       Cluster
	target   string
	strategy Strategy
	opts     ReplaceOptions
	shapes   [][]Step
}

// modelCounts is one worker's tally.
type modelCounts struct{ cases, plans, refusals, steps int64 }

func (n *modelCounts) add(o modelCounts) {
	n.cases += o.cases
	n.plans += o.plans
	n.refusals += o.refusals
	n.steps += o.steps
}

// checkCase runs one case under policy p through the package and the reference. It returns a
// description of the first disagreement, or "".
func checkCase(c *modelCase, p Policy, n *modelCounts) string {
	n.cases++
	plan, err := c.cl.PlanFor(p, c.strategy, c.target, c.opts)
	ti := refFind(c.ms, c.target)
	shapes := c.shapes
	precondition := Violation(0)
	switch {
	case c.ms.m[ti].disruption == InFlight:
		precondition = AlreadyInFlight
	case c.strategy == Replace && c.ms.m[ti].learner:
		precondition = NotAVoter
	}
	firstSafe, safeCost := -1, 0
	if precondition == 0 {
		for i, steps := range shapes {
			if ok, cost := refWalkWorlds(c.ms, c.target, steps, p); ok {
				firstSafe, safeCost = i, cost
				break
			}
		}
	}

	if err == nil {
		n.plans++
		if firstSafe < 0 {
			return fmt.Sprintf("planned %v but the reference finds no safe shape", plan)
		}
		if !slices.Equal(plan.Steps, shapes[firstSafe]) {
			return fmt.Sprintf("planned %v, the first safe shape is %v", plan.Steps, shapes[firstSafe])
		}
		if plan.Cost != safeCost {
			return fmt.Sprintf("plan cost %d, reference %d", plan.Cost, safeCost)
		}
		return walkInvariant(c.cl, c.ms, plan.Steps, p, n)
	}

	n.refusals++
	if firstSafe >= 0 {
		return fmt.Sprintf("refused (%v) but shape %v is safe", err, shapes[firstSafe])
	}
	var refusals []*Refusal
	switch e := err.(type) {
	case *ReplaceRefusal:
		if len(e.Shapes) != len(shapes) {
			return fmt.Sprintf("replace refusal lists %d shapes, %d were allowed", len(e.Shapes), len(shapes))
		}
		for _, s := range e.Shapes {
			refusals = append(refusals, s.Reason)
		}
	case *Refusal:
		refusals = []*Refusal{e}
	default:
		return fmt.Sprintf("refused with %T %v, want a *Refusal", err, err)
	}
	for i, r := range refusals {
		if msg := checkRefusal(r, c, p, shapes[i], precondition); msg != "" {
			return msg
		}
	}
	return ""
}

// checkRefusal asserts that r names a real violation at a real step of steps, with the right numbers,
// in one of the target's worlds.
func checkRefusal(r *Refusal, c *modelCase, p Policy, steps []Step, precondition Violation) string {
	if precondition != 0 {
		if r.Violation != precondition || r.Step.Member != c.target {
			return fmt.Sprintf("refusal %v (%v), want %v on %s", r, r.Violation, precondition, c.target)
		}
		return ""
	}
	var msg string
	for _, w := range refWorlds(c.ms, c.target) {
		if msg = checkRefusalIn(w, r, p, steps); msg == "" {
			return ""
		}
	}
	return msg
}

func checkRefusalIn(ms refCluster, r *Refusal, p Policy, steps []Step) string {
	for _, s := range steps {
		if s == r.Step {
			if !refHolds(r.Violation, ms, s, p) {
				return fmt.Sprintf("refusal %q (%v) at %v does not hold in %v", r, r.Violation, s, ms)
			}
			v, h, _ := refCounts(ms)
			if r.Before.Voters != v || r.Before.HealthyVoters != h || r.Before.Quorum != refQuorum(v) {
				return fmt.Sprintf("refusal %q: before-numbers %+v, reference voters=%d healthy=%d", r, r.Before, v, h)
			}
			if r.Violation == BelowQuorum || r.Violation == BelowFaultTolerance {
				av, ah, _ := refCounts(refApply(ms, s))
				if r.After.Voters != av || r.After.HealthyVoters != ah || r.After.Quorum != refQuorum(av) {
					return fmt.Sprintf("refusal %q: after-numbers %+v, reference voters=%d healthy=%d", r, r.After, av, ah)
				}
			}
			return ""
		}
		next := refApply(ms, s)
		if !refSafe(ms, next, s, p) {
			return fmt.Sprintf("refusal %q names %v, but the earlier step %v is already unsafe", r, r.Step, s)
		}
		ms = next
	}
	return fmt.Sprintf("refusal %q names step %v, which is not in %v", r, r.Step, steps)
}

// walkInvariant applies every step with the reference and asserts the invariant directly.
func walkInvariant(cl Cluster, ms refCluster, steps []Step, p Policy, n *modelCounts) string {
	for _, s := range steps {
		n.steps++
		v, h, l := refCounts(ms)
		b := cl.Budget(p)
		if b.Voters != v || b.HealthyVoters != h || b.Learners != l || b.Quorum != refQuorum(v) {
			return fmt.Sprintf("budget %+v disagrees with reference voters=%d healthy=%d learners=%d", b, v, h, l)
		}
		if isMembership(s.Op) && h < refQuorum(v) {
			return fmt.Sprintf("%v changes membership without quorum", s)
		}
		if i := refFind(ms, s.Member); s.Op == OpRemove && !ms.m[i].learner && v == 1 {
			return fmt.Sprintf("%v removes the last voter", s)
		}
		if s.Op == OpAddLearner && l >= p.MaxLearners {
			return fmt.Sprintf("%v exceeds the learner limit %d", s, p.MaxLearners)
		}
		next := refApply(ms, s)
		av, ah, _ := refCounts(next)
		if h >= refQuorum(v) && ah < refQuorum(av) {
			return fmt.Sprintf("%v takes healthy voters from %d/%d to %d/%d, below quorum %d", s, h, v, ah, av, refQuorum(av))
		}
		if before, after := h-refQuorum(v), ah-refQuorum(av); after < before && after < p.MinFaultTolerance {
			return fmt.Sprintf("%v lowers fault tolerance to %d, below minFaultTolerance %d", s, after, p.MinFaultTolerance)
		}
		var err error
		if cl, err = cl.Check(p, s); err != nil {
			return fmt.Sprintf("step %v of an accepted plan refused on re-check: %v", s, err)
		}
		ms = next
	}
	return ""
}

// multisets calls f with every multiset of size n over k kinds, as a non-decreasing slice of kinds.
func multisets(n, k int, f func([]int)) {
	cur := make([]int, n)
	var rec func(pos, from int)
	rec = func(pos, from int) {
		if pos == n {
			f(cur)
			return
		}
		for x := from; x < k; x++ {
			cur[pos] = x
			rec(pos+1, x)
		}
	}
	rec(0, 0)
}

func TestModelCheck(t *testing.T) {
	// Tens of millions of short-lived plans and refusals over a heap of a few MiB: let it grow before
	// collecting (about 30 % less time on 2 cores).
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	start := time.Now()
	var counts modelCounts
	policies := []Policy{}
	for _, minFT := range []int{0, 1, 2} {
		for _, maxL := range []int{0, 1} {
			policies = append(policies, Policy{MinFaultTolerance: minFT, MaxLearners: maxL})
		}
	}
	orderSets := [][]Order{{ScaleUpFirst, ScaleDownFirst}, {ScaleDownFirst, ScaleUpFirst}, {ScaleUpFirst}, {ScaleDownFirst}}

	// All member states: 3 healths × 3 disruptions.
	var states []refMember
	for _, h := range []Health{HealthUnknown, Healthy, Unhealthy} {
		for _, d := range []Disruption{NotDisrupted, InFlight, Fenced} {
			states = append(states, refMember{health: h, disruption: d})
		}
	}

	// One producer lists the clusters; one worker per core checks every request on each.
	clusters := make(chan refCluster, 256)
	go func() {
		defer close(clusters)
		for voters := 1; voters <= 7; voters++ {
			multisets(voters, len(states), func(vk []int) {
				for lk := -1; lk < len(states); lk++ { // -1: no learner
					var ms refCluster
					for _, k := range vk {
						ms.m[ms.n] = states[k]
						ms.m[ms.n].name = fmt.Sprintf("v%d", ms.n)
						ms.n++
					}
					if lk >= 0 {
						ms.m[ms.n] = states[lk]
						ms.m[ms.n].name, ms.m[ms.n].learner = "l0", true
						ms.n++
					}
					clusters <- ms
				}
			})
		}
	}()
	var (
		mu       sync.Mutex
		failures []string
		wg       sync.WaitGroup
	)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local []string
			var tally modelCounts
			check := func(c modelCase) {
				for _, p := range policies {
					if msg := checkCase(&c, p, &tally); msg != "" && len(local) < 5 {
						local = append(local, fmt.Sprintf("%s %v on %v (policy %+v, options %+v): %s", c.strategy, c.target, c.ms, p, c.opts, msg))
					}
				}
			}
			for ms := range clusters {
				cl := Cluster{Members: make([]Member, ms.n)}
				for i, m := range ms.list() {
					cl.Members[i] = Member{Name: m.name, Learner: m.learner, Health: m.health, Disruption: m.disruption}
				}
				for ti, m := range ms.list() {
					if ti > 0 && !m.learner && m.health == ms.m[ti-1].health && m.disruption == ms.m[ti-1].disruption {
						continue // same state as the previous voter: the same case up to renaming
					}
					for _, s := range []Strategy{Reboot, Fence} {
						check(modelCase{ms: ms, cl: cl, target: m.name, strategy: s, shapes: refShapes(s, m.name, "", nil, 0)})
					}
					for _, os := range orderSets {
						for _, j := range []Join{JoinAsLearner, JoinAsVoter} {
							opts := ReplaceOptions{NewMember: "new", Orders: os, Join: j}
							check(modelCase{ms: ms, cl: cl, target: m.name, strategy: Replace, opts: opts,
								shapes: refShapes(Replace, m.name, opts.NewMember, os, j)})
						}
					}
				}
			}
			mu.Lock()
			failures = append(failures, local...)
			counts.add(tally)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	require.Empty(t, failures, "disagreements between the package and the reference (first 5 per worker)")
	msg := fmt.Sprintf("model check: %d cases (%d plans, %d refusals), %d plan steps walked, in %v",
		counts.cases, counts.plans, counts.refusals, counts.steps, elapsed.Round(time.Millisecond))
	t.Log(msg)
	require.Positive(t, counts.plans)
	require.Positive(t, counts.refusals)
}
