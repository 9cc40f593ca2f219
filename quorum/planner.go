package quorum

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// DefaultPool is the pool of a machine that names none.
const DefaultPool = "default"

// Machine is one machine as the planner needs it.
type Machine struct {
	Name string
	// Member is the machine's etcd member name; empty when the machine is not an etcd member.
	Member string
	// Pool groups machines that are not etcd members for PoolLimits; empty means DefaultPool.
	Pool string
	// Unhealthy says the machine's verdict is Unhealthy, since Since.
	Unhealthy bool
	Since     time.Time
	// Strategy is how the machine is healed.
	Strategy Strategy
	// Replace is what the owner can do when Strategy is Replace.
	Replace ReplaceOptions
	// InFlight says a remediation of this machine is already under way (with Strategy).
	InFlight bool
	// Remaining, for a machine in flight, are the steps of its plan still to come, the one under way
	// included. Nil means its strategy's plan from the start (for a replace, in its first order).
	// Either way the steps the membership already shows done are skipped (Cluster.Remaining). Every
	// start must be safe in every order of its steps with these (checkOrders).
	Remaining []Step
	// Held, when set, says why the caller will not start a remediation of this machine now (detached,
	// cooling down, given up): it still counts as unhealthy in its pool, gets a decision with this
	// reason, and is never started or admitted against the budget.
	Held string
}

func (m Machine) pool() string {
	if m.Pool == "" {
		return DefaultPool
	}
	return m.Pool
}

// Input is everything one planning pass looks at.
type Input struct {
	Cluster  Cluster
	Machines []Machine
	Policy   Policy
}

// Decision is what the pass says about one machine that is unhealthy or already being remediated.
type Decision struct {
	Machine  string
	Member   string
	Pool     string
	Strategy Strategy
	// Start says the remediation may start now.
	Start bool
	// InFlight says the remediation was already running before this pass.
	InFlight bool
	// Plan is the quorum-safe plan, for an etcd member that may start.
	Plan Plan
	// Reason says why it may start, why it waits, or that it is in flight.
	Reason string
	// Err is the refusal behind a wait, when there is one (*Refusal, *ReplaceRefusal).
	Err error
}

// Outcome is the result of one planning pass.
type Outcome struct {
	// Budget is the etcd budget as observed, remediations already in flight counted as disruptions.
	Budget Budget
	// After is the budget with what this pass starts counted as in flight too.
	After Budget
	// Decisions lists in-flight machines first, then the candidates in the order they were considered:
	// most broken first (etcd members that are not healthy voters, then sick machines whose etcd member
	// is healthy, then machines that are not etcd members), longest unhealthy first, then by name.
	Decisions []Decision
}

// Started returns the decisions that start now, in order.
func (o Outcome) Started() []Decision {
	var out []Decision
	for _, d := range o.Decisions {
		if d.Start {
			out = append(out, d)
		}
	}
	return out
}

type poolCount struct{ total, unhealthy, inFlight int }

type candidate struct {
	m    *Machine
	rank int // 0: etcd member not a healthy voter; 1: healthy etcd member; 2: not an etcd member
}

// PlanPass decides which remediations may start now. It walks the candidates most broken first and
// admits each one whose plan keeps quorum with everything admitted before it counted as in flight, so
// all admitted work together is safe in any interleaving. Membership changes go one at a time, and
// while one is in flight only free disruptions (members that are not healthy voters) start. Machines
// that are not etcd members are capped per pool by Policy.Pools.
//
// It returns an error only for input that cannot be planned at all (duplicate machine names, two
// machines claiming one member, an unknown strategy); that error names the machine.
func PlanPass(in Input) (Outcome, error) {
	if err := in.Policy.Validate(); err != nil {
		return Outcome{}, fmt.Errorf("policy: %w", err)
	}
	work := in.Cluster.Clone()
	memberAt := make(map[string]int, len(work.Members))
	for i, m := range work.Members {
		if _, dup := memberAt[m.Name]; dup {
			return Outcome{}, fmt.Errorf("membership lists etcd member %q twice", m.Name)
		}
		memberAt[m.Name] = i
	}

	names := make(map[string]struct{}, len(in.Machines))
	claimed := make(map[string]string, len(work.Members))
	pools := make(map[string]*poolCount)
	var out Outcome
	var cands []candidate
	membershipChange := false
	for i := range in.Machines {
		m := &in.Machines[i]
		if m.Name == "" {
			return Outcome{}, fmt.Errorf("machine #%d has no name", i)
		}
		if _, dup := names[m.Name]; dup {
			return Outcome{}, fmt.Errorf("machine %q is listed twice", m.Name)
		}
		names[m.Name] = struct{}{}
		if (m.Unhealthy || m.InFlight) && (m.Strategy < Reboot || m.Strategy > Replace) {
			return Outcome{}, fmt.Errorf("machine %q: unknown strategy %v", m.Name, m.Strategy)
		}
		if m.Member != "" {
			if other, dup := claimed[m.Member]; dup {
				return Outcome{}, fmt.Errorf("machines %q and %q both claim etcd member %q", other, m.Name, m.Member)
			}
			claimed[m.Member] = m.Name
			// A reboot or fence in flight may have the member down at any moment. A replace in flight
			// keeps its old member a voter until the plan removes it; it is guarded by membershipChange.
			if j, ok := memberAt[m.Member]; ok && m.InFlight && m.Strategy != Replace && work.Members[j].Disruption == NotDisrupted {
				work.Members[j].Disruption = InFlight
			}
			membershipChange = membershipChange || (m.InFlight && m.Strategy == Replace)
		} else {
			pc := pools[m.pool()]
			if pc == nil {
				pc = &poolCount{}
				pools[m.pool()] = pc
			}
			pc.total++
			if m.Unhealthy || m.InFlight {
				pc.unhealthy++
			}
			if m.InFlight {
				pc.inFlight++
			}
		}
		switch {
		case m.InFlight:
			out.Decisions = append(out.Decisions, Decision{Machine: m.Name, Member: m.Member, Pool: poolOf(m),
				Strategy: m.Strategy, InFlight: true, Reason: m.Strategy.String() + " in flight"})
		case m.Unhealthy:
			cands = append(cands, candidate{m: m, rank: rankOf(work, memberAt, m)})
		}
	}
	out.Budget = work.Budget(in.Policy)
	// Every start is checked in every order of its steps with what is still to come of the work in
	// flight, and with what this pass started before it, from the cluster as observed.
	base := work.Clone()
	tracks := inFlightTracks(base, in.Machines)

	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), a.m.Since.Compare(b.m.Since), cmp.Compare(a.m.Name, b.m.Name))
	})
	for _, c := range cands {
		m := c.m
		d := Decision{Machine: m.Name, Member: m.Member, Pool: poolOf(m), Strategy: m.Strategy}
		switch {
		case m.Held != "":
			d.Reason = m.Held
		case m.Member == "":
			admitPoolMachine(&d, pools[m.pool()], in.Policy.Pools)
		default:
			tracks = admitMember(&d, &work, base, tracks, memberAt, in.Policy, m, &membershipChange)
		}
		out.Decisions = append(out.Decisions, d)
	}
	out.After = work.Budget(in.Policy)
	return out, nil
}

func poolOf(m *Machine) string {
	if m.Member != "" {
		return ""
	}
	return m.pool()
}

func rankOf(work Cluster, memberAt map[string]int, m *Machine) int {
	if m.Member == "" {
		return 2
	}
	if j, ok := memberAt[m.Member]; ok && work.Members[j].CountsHealthy() {
		return 1
	}
	return 0
}

// admitMember decides whether m's remediation starts: its plan must be safe with everything admitted
// before it counted as in flight (work), and in every order of its steps with the steps still to come
// of the work in flight and of what this pass started before (tracks, from base, the cluster as
// observed). It returns tracks with m's plan added when it starts.
func admitMember(d *Decision, work *Cluster, base Cluster, tracks []track, memberAt map[string]int, p Policy, m *Machine, membershipChange *bool) []track {
	j, ok := memberAt[m.Member]
	if !ok {
		d.Reason = fmt.Sprintf("etcd member %s is not in the membership the agents agree on; waiting for a consistent view", m.Member)
		return tracks
	}
	if *membershipChange && (m.Strategy == Replace || work.Members[j].CountsHealthy()) {
		d.Err = work.refusal(p, MembershipChangeInFlight, Step{m.Strategy.firstOp(), m.Member})
		d.Reason = d.Err.Error()
		return tracks
	}
	plan, err := work.PlanFor(p, m.Strategy, m.Member, m.Replace)
	if err == nil {
		tracks = append(tracks, freshTrack(m, plan))
		if err = checkOrders(base, p, tracks, plan); err != nil {
			tracks = tracks[:len(tracks)-1]
		}
	}
	if err != nil {
		d.Err, d.Reason = err, err.Error()
		return tracks
	}
	d.Start, d.Plan = true, plan
	switch {
	case plan.Cost > 0 && unknownVoter(work.Members, Step{OpRemove, m.Member}) >= 0:
		up := work.Clone()
		up.Members[j].Health = Healthy
		d.Reason = fmt.Sprintf("costs %d if %s is up (its health is unknown), of a budget of %d counting it", plan.Cost, m.Member, up.Budget(p).Available)
	case plan.Cost > 0:
		d.Reason = fmt.Sprintf("costs %d of a budget of %d", plan.Cost, work.Budget(p).Available)
	case !work.Members[j].CountsHealthy():
		d.Reason = fmt.Sprintf("free: %s is not a healthy voter", m.Member)
	default:
		d.Reason = "free: the fault tolerance never drops below where it is now"
	}
	if m.Strategy == Replace {
		// Later candidates in this pass may only be free disruptions, which no step of this plan counts on.
		*membershipChange = true
	} else {
		work.Members[j].Disruption = InFlight
	}
	return tracks
}

func admitPoolMachine(d *Decision, pc *poolCount, l PoolLimits) {
	if maxU := l.MaxUnhealthy.Of(pc.total); maxU >= 0 && pc.unhealthy > maxU {
		d.Reason = fmt.Sprintf("pool %s: %d of %d machines are unhealthy, more than maxUnhealthy %v (%d): "+
			"remediation is held for the whole pool until fewer are unhealthy", d.Pool, pc.unhealthy, pc.total, l.MaxUnhealthy, maxU)
		return
	}
	if maxF := maxInFlight(l.MaxInFlight, pc.total); maxF >= 0 && pc.inFlight >= maxF {
		d.Reason = fmt.Sprintf("pool %s: %d remediation(s) in flight, maxInFlight %v of %d machines allows %d",
			d.Pool, pc.inFlight, l.MaxInFlight, pc.total, maxF)
		return
	}
	pc.inFlight++
	d.Start = true
	d.Reason = fmt.Sprintf("pool %s: %d of %d in flight with this one", d.Pool, pc.inFlight, pc.total)
}

// maxInFlight is l of total, rounded down, but at least one for a non-zero percentage.
func maxInFlight(l Limit, total int) int {
	n := l.Of(total)
	if l.percent && l.value > 0 && n == 0 {
		return 1
	}
	return n
}
