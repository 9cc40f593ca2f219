package quorum

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// This file model-checks whole planning passes against remediations already in flight. Its invariant
// is written from etcd's rules, separately from the package (which explores orders as a lattice of
// progress vectors with its own state): this reference walks the orders one step at a time, carrying
// its own state, and asserts on the way that the state after a set of steps does not depend on their
// order (what the package's lattice relies on).
//
// etcd's rules, as the reference reads them:
//   - quorum(v) = v/2 + 1 over voters; learners never count. A voter is up when etcd calls it healthy
//     (or a remediation brought it back) and no power step holds it down.
//   - power-cycle holds a member down until the same remediation's await sees it back; power-off holds
//     it down for good. An await completes only once nothing else holds the member down and it is there.
//   - add (learner or voter), promote and remove are raft entries: they need an up quorum to commit;
//     etcd refuses a learner past --max-learners, a promote of a learner that is not up (in sync), and
//     removing the last voter. A new member is not up until awaited.
//   - a step is a hazard when it lowers the fault tolerance (up voters − quorum) to below 0 or below the
//     policy's headroom.
//
// The pass invariant: in every order of the steps still to come of the work in flight and of what
// the pass starts, (a) no step of what the pass starts is a hazard, and (b) a step of the work in flight
// is a hazard only where it is one anyway without what the pass starts (its recoveries kept) and no
// less deep. Every refusal of the kind "unsafe beside the work in flight" must name an order that
// really breaks (b) or (a). Started plans must be their strategy's steps.

type pmMember struct {
	name     string
	learner  bool
	healthy  bool // etcd calls it healthy, or a remediation brought it back
	observed bool // the input already showed it disrupted (down)
	off      bool // the input showed it fenced
	owner    int  // the track whose doing the input's disruption is; -1 none
	hold     int  // the track holding it down now; -1 none
	holdOff  bool
}

type pmState struct{ ms []pmMember }

func (st pmState) clone() pmState { return pmState{ms: slices.Clone(st.ms)} }

func (st pmState) find(name string) int {
	return slices.IndexFunc(st.ms, func(m pmMember) bool { return m.name == name })
}

func (st pmState) up(m pmMember) bool {
	return m.healthy && !m.observed && !m.off && m.hold < 0
}

func (st pmState) counts() (voters, up, learners int) {
	for _, m := range st.ms {
		switch {
		case m.learner:
			learners++
		default:
			voters++
			if st.up(m) {
				up++
			}
		}
	}
	return
}

func (st pmState) ft() int {
	v, u, _ := st.counts()
	return u - refQuorum(v)
}

type pmTrack struct {
	machine string
	own     string
	steps   []Step
	fresh   bool
}

// pmStep applies track ti's step s: ok false when it cannot happen from st.
func pmStep(st pmState, p Policy, ti int, own string, s Step) (pmState, bool) {
	next := st.clone()
	i := st.find(s.Member)
	v, u, l := st.counts()
	quorate := u >= refQuorum(v)
	switch s.Op {
	case OpPowerCycle, OpPowerOff:
		if i < 0 {
			return st, false
		}
		next.ms[i].hold, next.ms[i].holdOff = ti, s.Op == OpPowerOff
	case OpAwaitHealthy:
		if i < 0 {
			return st, false
		}
		m := st.ms[i]
		if m.hold >= 0 && m.hold != ti || (m.observed || m.off) && m.owner >= 0 && m.owner != ti || m.off && m.owner < 0 && own != s.Member {
			return st, false
		}
		next.ms[i].healthy = true
		if m.hold == ti {
			next.ms[i].hold = -1
		}
		if own == s.Member {
			next.ms[i].observed, next.ms[i].off = false, false
		}
	case OpAddLearner, OpAddVoter:
		if i >= 0 || !quorate || s.Op == OpAddLearner && l >= p.MaxLearners {
			return st, false
		}
		next.ms = append(next.ms, pmMember{name: s.Member, learner: s.Op == OpAddLearner, owner: -1, hold: -1})
	case OpPromote:
		if i < 0 || !quorate || !st.ms[i].learner || !st.up(st.ms[i]) {
			return st, false
		}
		next.ms[i].learner = false
	case OpRemove:
		if i < 0 || !quorate || !st.ms[i].learner && v == 1 {
			return st, false
		}
		next.ms = slices.Delete(next.ms, i, i+1)
	}
	return next, true
}

func pmHazard(before, after pmState, p Policy) bool {
	b, a := before.ft(), after.ft()
	return a < b && (a < 0 || a < p.MinFaultTolerance)
}

func pmSame(a, b pmState) bool {
	if len(a.ms) != len(b.ms) {
		return false
	}
	for _, m := range a.ms {
		j := b.find(m.name)
		if j < 0 || b.ms[j] != m {
			return false
		}
	}
	return true
}

// pmStart is the input cluster as the reference's state in one world (up: the members of unknown
// health taken to be healthy in it): a reboot or fence in flight may have its member down at any moment
// (the input's contract), the doing of its own track.
func pmStart(in Input, tracks []pmTrack, up map[string]bool) pmState {
	var st pmState
	for _, m := range in.Cluster.Members {
		st.ms = append(st.ms, pmMember{name: m.Name, learner: m.Learner, healthy: m.Health == Healthy || up[m.Name],
			observed: m.Disruption == InFlight, off: m.Disruption == Fenced, owner: -1, hold: -1})
	}
	for ti, t := range tracks {
		if i := st.find(t.own); i >= 0 {
			st.ms[i].owner = ti
		}
	}
	for _, m := range in.Machines {
		if i := st.find(m.Member); m.InFlight && m.Member != "" && m.Strategy != Replace && i >= 0 && !st.ms[i].observed && !st.ms[i].off {
			st.ms[i].observed = true
		}
	}
	return st
}

// pmRemaining is the reference's reading of what an in-flight machine still has to do: its given
// steps, or its strategy's plan, from after the last step the membership shows done.
func pmRemaining(in Input, m Machine) []Step {
	steps := m.Remaining
	if steps == nil {
		switch m.Strategy {
		case Reboot:
			steps = []Step{{OpPowerCycle, m.Member}, {OpAwaitHealthy, m.Member}}
		case Fence:
			steps = []Step{{OpPowerOff, m.Member}}
		case Replace:
			if m.Replace.NewMember == "" {
				return nil
			}
			orders := m.Replace.Orders
			if len(orders) == 0 {
				orders = []Order{ScaleUpFirst}
			}
			join := m.Replace.Join
			if join == 0 {
				join = JoinAsLearner
			}
			steps = refShapes(Replace, m.Member, m.Replace.NewMember, orders[:1], join)[0]
		}
	}
	has := func(name string) (bool, bool) {
		for _, x := range in.Cluster.Members {
			if x.Name == name {
				return true, x.Learner
			}
		}
		return false, false
	}
	from := 0
	for i, s := range steps {
		present, learner := has(s.Member)
		if (s.Op == OpAddLearner || s.Op == OpAddVoter) && present || s.Op == OpPromote && present && !learner || s.Op == OpRemove && !present {
			from = i + 1
		}
	}
	return steps[from:]
}

// pmTracks lists the work in flight, then what the pass started up to (not including) decision upTo,
// in decision order.
func pmTracks(in Input, out Outcome, upTo int) []pmTrack {
	var tracks []pmTrack
	for _, m := range in.Machines {
		if m.InFlight && m.Member != "" {
			if steps := pmRemaining(in, m); len(steps) > 0 {
				tracks = append(tracks, pmTrack{machine: m.Name, own: m.Member, steps: steps})
			}
		}
	}
	for _, d := range out.Decisions[:upTo] {
		if d.Start && d.Member != "" {
			tracks = append(tracks, pmTrack{machine: d.Machine, own: d.Member, steps: d.Plan.Steps, fresh: true})
		}
	}
	return tracks
}

// pmWithout replays order (track indexes) from the start without the fresh tracks' steps, but for
// their awaits of members the input had, as recoveries.
func pmWithout(start pmState, p Policy, tracks []pmTrack, order []int) pmState {
	st := start.clone()
	prog := make([]int, len(tracks))
	for _, ti := range order {
		s := tracks[ti].steps[prog[ti]]
		prog[ti]++
		if tracks[ti].fresh {
			if i := st.find(s.Member); s.Op == OpAwaitHealthy && i >= 0 && start.find(s.Member) >= 0 {
				st.ms[i].healthy = true
			}
			continue
		}
		if next, ok := pmStep(st, p, ti, tracks[ti].own, s); ok {
			st = next
		}
	}
	return st
}

// pmJudge says whether track ti's step s, taken from st after order, breaks the invariant.
func pmJudge(start, st pmState, p Policy, tracks []pmTrack, order []int, ti int, s Step) (bool, string) {
	next, ok := pmStep(st, p, ti, tracks[ti].own, s)
	if !ok || !pmHazard(st, next, p) {
		return false, ""
	}
	if tracks[ti].fresh {
		return true, fmt.Sprintf("started step %v (%s) lowers fault tolerance %d → %d", s, tracks[ti].machine, st.ft(), next.ft())
	}
	alt := pmWithout(start, p, tracks, order)
	altNext, ok := pmStep(alt, p, ti, tracks[ti].own, s)
	if ok && pmHazard(alt, altNext, p) && next.ft() >= altNext.ft() {
		return false, "" // a hazard of the work in flight anyway, not deepened
	}
	return true, fmt.Sprintf("in-flight step %v (%s) becomes a hazard: fault tolerance %d → %d (without the started work: %v)",
		s, tracks[ti].machine, st.ft(), next.ft(), func() string {
			if !ok {
				return "it cannot happen"
			}
			return fmt.Sprintf("%d → %d", alt.ft(), altNext.ft())
		}())
}

// pmWorlds are the worlds the started work must be safe in: nobody can say whether a voter of unknown
// health is up, so each one that a started remediation takes down may be either (every subset of them
// up), while the others, which nothing started acts on, stay not counted.
func pmWorlds(in Input, tracks []pmTrack) []map[string]bool {
	var unknown []string
	for _, t := range tracks {
		for _, m := range in.Cluster.Members {
			if t.fresh && m.Name == t.own && !m.Learner && m.Health == HealthUnknown && m.Disruption == NotDisrupted {
				unknown = append(unknown, m.Name)
			}
		}
	}
	var worlds []map[string]bool
	for bits := range 1 << len(unknown) {
		up := map[string]bool{}
		for i, name := range unknown {
			up[name] = bits&(1<<i) != 0
		}
		worlds = append(worlds, up)
	}
	return worlds
}

// pmExplore walks every order of the tracks' steps in one world; it returns the first broken invariant
// and how many states it saw.
func pmExplore(in Input, tracks []pmTrack, up map[string]bool) (string, int) {
	start := pmStart(in, tracks, up)
	seen := map[int]pmState{}
	var msg string
	var walk func(st pmState, prog []int, order []int)
	walk = func(st pmState, prog []int, order []int) {
		if msg != "" {
			return
		}
		key := 0
		for _, n := range prog {
			key = key*8 + n
		}
		if prev, ok := seen[key]; ok {
			if !pmSame(prev, st) {
				msg = fmt.Sprintf("the state after %v depends on the order: %+v vs %+v", prog, prev.ms, st.ms)
			}
			return
		}
		seen[key] = st
		for ti, t := range tracks {
			if prog[ti] == len(t.steps) {
				continue
			}
			s := t.steps[prog[ti]]
			if bad, why := pmJudge(start, st, in.Policy, tracks, order, ti, s); bad {
				msg = fmt.Sprintf("after %s: %s", pmOrder(tracks, order), why)
				return
			}
			next, ok := pmStep(st, in.Policy, ti, t.own, s)
			if !ok {
				continue
			}
			np := slices.Clone(prog)
			np[ti]++
			walk(next, np, append(slices.Clip(order), ti))
		}
	}
	walk(start, make([]int, len(tracks)), nil)
	return msg, len(seen)
}

func pmOrder(tracks []pmTrack, order []int) string {
	prog := make([]int, len(tracks))
	var parts []string
	for _, ti := range order {
		parts = append(parts, fmt.Sprintf("%v (%s)", tracks[ti].steps[prog[ti]], tracks[ti].machine))
		prog[ti]++
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, " → ")
}

// pmReplay checks an OrderRefusal against the reference: in one of the worlds, its order can happen
// and its breaking step breaks the invariant there.
func pmReplay(in Input, out Outcome, at int, r *OrderRefusal) string {
	tracks := pmTracks(in, out, at)
	d := out.Decisions[at]
	tracks = append(tracks, pmTrack{machine: d.Machine, own: d.Member, steps: r.Plan.Steps, fresh: true})
	var msg string
	for _, up := range pmWorlds(in, tracks) {
		if msg = pmReplayIn(in, tracks, r, up); msg == "" {
			return ""
		}
	}
	return msg
}

func pmReplayIn(in Input, tracks []pmTrack, r *OrderRefusal, up map[string]bool) string {
	start := pmStart(in, tracks, up)
	st := start
	prog := make([]int, len(tracks))
	var order []int
	index := func(machine string) int {
		return slices.IndexFunc(tracks, func(t pmTrack) bool { return t.machine == machine })
	}
	for _, os := range r.Before {
		ti := index(os.Machine)
		if ti < 0 || prog[ti] >= len(tracks[ti].steps) || tracks[ti].steps[prog[ti]] != os.Step {
			return fmt.Sprintf("refusal %q: step %v of %s is not that remediation's next step", r, os.Step, os.Machine)
		}
		next, ok := pmStep(st, in.Policy, ti, tracks[ti].own, os.Step)
		if !ok {
			return fmt.Sprintf("refusal %q: step %v of %s cannot happen there", r, os.Step, os.Machine)
		}
		st = next
		prog[ti]++
		order = append(order, ti)
	}
	ti := index(r.Breaking.Machine)
	if ti < 0 || prog[ti] >= len(tracks[ti].steps) || tracks[ti].steps[prog[ti]] != r.Breaking.Step {
		return fmt.Sprintf("refusal %q: the breaking step is not %s's next", r, r.Breaking.Machine)
	}
	if bad, _ := pmJudge(start, st, in.Policy, tracks, order, ti, r.Breaking.Step); !bad {
		return fmt.Sprintf("refusal %q: the reference finds its breaking step fine", r)
	}
	return ""
}

// checkPassOrders asserts the pass invariant on one pass; it returns the first breach, and counts.
func checkPassOrders(in Input, out Outcome, n *passCounts) string {
	for i, d := range out.Decisions {
		if !d.Start || d.Member == "" {
			var r *OrderRefusal
			if errors.As(d.Err, &r) && !r.TooMany {
				n.orderRefusals++
				if msg := pmReplay(in, out, i, r); msg != "" {
					return msg
				}
			}
			continue
		}
		n.started++
		want := refShapes(d.Strategy, d.Member, "", nil, 0)
		if d.Strategy == Replace {
			var m Machine
			for _, x := range in.Machines {
				if x.Name == d.Machine {
					m = x
				}
			}
			orders, join := m.Replace.Orders, m.Replace.Join
			if len(orders) == 0 {
				orders = []Order{ScaleUpFirst, ScaleDownFirst}
			}
			if join == 0 {
				join = JoinAsLearner
			}
			want = refShapes(Replace, d.Member, m.Replace.NewMember, orders, join)
		}
		if !slices.ContainsFunc(want, func(s []Step) bool { return slices.Equal(s, d.Plan.Steps) }) {
			return fmt.Sprintf("started %s of %s with steps %v, not one of %v", d.Strategy, d.Machine, d.Plan.Steps, want)
		}
	}
	tracks := pmTracks(in, out, len(out.Decisions))
	for _, up := range pmWorlds(in, tracks) {
		msg, states := pmExplore(in, tracks, up)
		n.states += int64(states)
		if msg != "" {
			return msg
		}
	}
	return ""
}

type passCounts struct{ passes, started, orderRefusals, states int64 }

func (n *passCounts) add(o passCounts) {
	n.passes += o.passes
	n.started += o.started
	n.orderRefusals += o.orderRefusals
	n.states += o.states
}

// pmRole is what a member's machine is doing in a case: nothing, a candidate of some strategy, or a
// remediation in flight with its steps still to come.
type pmRole struct {
	candidate Strategy
	opts      ReplaceOptions
	inFlight  Strategy
	remaining []Step
}

// TestPassModelCheck enumerates every pass over clusters of up to 5 members: up to 2 voters with work
// in flight (a reboot before or after its power-cycle, a fence, a replace at any step of any shape,
// whose new member may itself be a machine the pass wants to fence or reboot), every other voter idle
// or a candidate (reboot, fence, replace delete-first or scale-up-first), every etcd health, and two
// policies; and checks each pass against the reference above.
func TestPassModelCheck(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(400)) // millions of short-lived states
	start := time.Now()
	policies := []Policy{{MaxLearners: 1}, {MinFaultTolerance: 1, MaxLearners: 1}}
	healths := []Health{Healthy, Unhealthy, HealthUnknown}
	var roles []pmRole
	for _, s := range []Strategy{Reboot, Fence} {
		roles = append(roles, pmRole{candidate: s})
	}
	roles = append(roles,
		pmRole{candidate: Replace, opts: ReplaceOptions{Orders: []Order{ScaleUpFirst, ScaleDownFirst}, Join: JoinAsLearner}},
		pmRole{candidate: Replace, opts: ReplaceOptions{Orders: []Order{ScaleDownFirst}, Join: JoinAsVoter}})
	idle := pmRole{}
	var inFlight []pmRole
	inFlight = append(inFlight,
		pmRole{inFlight: Reboot, remaining: []Step{{OpPowerCycle, "@"}, {OpAwaitHealthy, "@"}}},
		pmRole{inFlight: Reboot, remaining: []Step{{OpAwaitHealthy, "@"}}},
		pmRole{inFlight: Fence, remaining: []Step{{OpPowerOff, "@"}}})
	for _, order := range []Order{ScaleUpFirst, ScaleDownFirst} {
		for _, join := range []Join{JoinAsLearner, JoinAsVoter} {
			steps := Shape{Order: order, Join: join}.Steps("@", "@new")
			for k := range steps {
				inFlight = append(inFlight, pmRole{inFlight: Replace, remaining: steps[k:],
					opts: ReplaceOptions{NewMember: "@new", Orders: []Order{order}, Join: join}})
			}
		}
	}

	cases := make(chan Input, 256)
	go func() {
		defer close(cases)
		// The voters that are neither in flight nor candidates are interchangeable: only how many of
		// each health there are matters.
		for voters := 1; voters <= 5; voters++ {
			for nFlight := 0; nFlight <= min(2, voters); nFlight++ {
				for nCand := 0; nCand <= voters-nFlight; nCand++ {
					nIdle := voters - nFlight - nCand
					multisets(nFlight, len(inFlight)*len(healths), func(fk []int) {
						replaces := 0
						for _, k := range fk {
							if inFlight[k/len(healths)].inFlight == Replace {
								replaces++
							}
						}
						if replaces > 1 {
							return
						}
						multisets(nCand, len(roles)*len(healths), func(ck []int) {
							multisets(nIdle, len(healths), func(ik []int) {
								emitPassCases(cases, policies, healths, inFlight, roles, idle, fk, ck, ik)
							})
						})
					})
				}
			}
		}
	}()

	var (
		mu       sync.Mutex
		failures []string
		counts   passCounts
		wg       sync.WaitGroup
	)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tally passCounts
			var local []string
			for in := range cases {
				tally.passes++
				out, err := PlanPass(in)
				if err != nil {
					local = append(local, fmt.Sprintf("%+v: %v", in, err))
					continue
				}
				if msg := checkPassOrders(in, out, &tally); msg != "" && len(local) < 5 {
					local = append(local, fmt.Sprintf("%s\n  cluster %v, policy %+v\n  machines %+v\n  decisions %+v", msg, in.Cluster, in.Policy, in.Machines, out.Decisions))
				}
			}
			mu.Lock()
			failures = append(failures, local...)
			counts.add(tally)
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Empty(t, failures, "passes that break the invariant (first 5 per worker)")
	t.Logf("pass model check: %d passes (clusters of up to 5 members, up to 2 remediations in flight), %d remediations started, "+
		"%d refused as unsafe beside the work in flight (each order replayed), %d states walked, in %v",
		counts.passes, counts.started, counts.orderRefusals, counts.states, time.Since(start).Round(time.Millisecond))
	require.Positive(t, counts.started)
	require.Positive(t, counts.orderRefusals)
}

// emitPassCases builds the passes for one choice of in-flight (fk), candidate (ck) and idle (ik)
// voters, each a kind index of role × health, under every policy. A replace in flight adds its new
// member where its steps so far added it, drops its old member where they removed it, and may have
// its new member claimed by a machine that the pass wants to fence or reboot.
func emitPassCases(out chan<- Input, policies []Policy, healths []Health, inFlight, roles []pmRole, idle pmRole, fk, ck, ik []int) {
	var c Cluster
	var ms []Machine
	n := 0
	add := func(r pmRole, h Health) {
		member, machine := fmt.Sprintf("etcd-%d", n), fmt.Sprintf("cp-%d", n)
		n++
		m := Machine{Name: machine, Member: member, Since: t0.Add(time.Duration(n) * time.Second)}
		switch {
		case r.inFlight != 0:
			m.InFlight, m.Strategy, m.Unhealthy = true, r.inFlight, true
			m.Remaining = rename(r.remaining, member)
			m.Replace = r.opts
			m.Replace.NewMember = strings.ReplaceAll(r.opts.NewMember, "@", member)
		case r.candidate != 0:
			m.Unhealthy, m.Strategy, m.Replace = true, r.candidate, r.opts
			m.Replace.NewMember = member + "-new"
		default:
			m.Strategy = Reboot
		}
		ms = append(ms, m)
		c.Members = append(c.Members, Member{Name: member, Health: h})
	}
	for _, k := range fk {
		add(inFlight[k/len(healths)], healths[k%len(healths)])
	}
	for _, k := range ck {
		add(roles[k/len(healths)], healths[k%len(healths)])
	}
	for _, k := range ik {
		add(idle, healths[k])
	}
	// The membership a replace in flight has made so far: everything before its remaining steps.
	var claims []Strategy
	for _, m := range ms {
		if !m.InFlight || m.Strategy != Replace {
			continue
		}
		full := Shape{Order: m.Replace.Orders[0], Join: m.Replace.Join}.Steps(m.Member, m.Replace.NewMember)
		done := full[:len(full)-len(m.Remaining)]
		for _, s := range done {
			switch s.Op {
			case OpAddLearner, OpAddVoter:
				c.Members = append(c.Members, Member{Name: s.Member, Learner: s.Op == OpAddLearner, Health: Unhealthy})
			case OpAwaitHealthy:
				c.Members[c.Index(s.Member)].Health = Healthy
			case OpPromote:
				c.Members[c.Index(s.Member)].Learner = false
			case OpRemove:
				c.Members = slices.DeleteFunc(c.Members, func(x Member) bool { return x.Name == s.Member })
			}
		}
		if c.Index(m.Replace.NewMember) >= 0 {
			claims = []Strategy{0, Fence, Reboot}
		}
	}
	if len(c.Members) > 5 {
		return
	}
	if claims == nil {
		claims = []Strategy{0}
	}
	for _, claim := range claims {
		machines := slices.Clone(ms)
		if claim != 0 {
			for _, m := range ms {
				if m.InFlight && m.Strategy == Replace {
					machines = append(machines, Machine{Name: "cp-new", Member: m.Replace.NewMember, Unhealthy: true, Strategy: claim, Since: t0})
				}
			}
		}
		for _, p := range policies {
			out <- Input{Cluster: c.Clone(), Machines: machines, Policy: p}
		}
	}
}

func rename(steps []Step, member string) []Step {
	out := make([]Step, len(steps))
	for i, s := range steps {
		out[i] = Step{s.Op, strings.ReplaceAll(s.Member, "@", member)}
	}
	return out
}
