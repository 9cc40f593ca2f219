package quorum

import (
	"fmt"
	"strings"
)

// Op is one kind of step.
type Op uint8

const (
	// OpPowerCycle reboots the member's machine in place (through its BMC): no membership change, the
	// member is down until it comes back.
	OpPowerCycle Op = iota + 1
	// OpPowerOff fences the member's machine: powered off and verified off; it stays down.
	OpPowerOff
	// OpAwaitHealthy is a checkpoint, not an action: wait until the member is healthy (a rebooted member
	// back in sync, a new member caught up). Nothing later starts before it is observed.
	OpAwaitHealthy
	// OpAddLearner adds a new non-voting member.
	OpAddLearner
	// OpPromote turns an in-sync learner into a voter.
	OpPromote
	// OpAddVoter adds a new voting member; it counts toward quorum before it is healthy.
	OpAddVoter
	// OpRemove removes a member (voter or learner) from the membership.
	OpRemove
)

// names returns the step's name and the gerund used in refusal messages ("rebooting etcd-2 leaves ...").
func (o Op) names() (name, gerund string) {
	switch o {
	case OpPowerCycle:
		return "power-cycle", "rebooting"
	case OpPowerOff:
		return "power-off", "fencing"
	case OpAwaitHealthy:
		return "await-healthy", "waiting for"
	case OpAddLearner:
		return "add-learner", "adding learner"
	case OpPromote:
		return "promote", "promoting"
	case OpAddVoter:
		return "add-voter", "adding voter"
	case OpRemove:
		return "remove", "removing"
	}
	return fmt.Sprintf("Op(%d)", uint8(o)), fmt.Sprintf("doing Op(%d) to", uint8(o))
}

func (o Op) valid() bool { return o >= OpPowerCycle && o <= OpRemove }

func (o Op) String() string {
	name, _ := o.names()
	return name
}

// ChangesMembership reports whether the step needs a committed raft entry (and so a live quorum).
func (o Op) ChangesMembership() bool {
	return o == OpAddLearner || o == OpPromote || o == OpAddVoter || o == OpRemove
}

// Irreversible reports whether the step has an external side effect that Hale must re-check the live
// membership for immediately before doing it (DESIGN.md rule 1). Only OpAwaitHealthy is not.
func (o Op) Irreversible() bool { return o.valid() && o != OpAwaitHealthy }

// Step is one step of a plan on one member.
type Step struct {
	Op     Op
	Member string
}

func (s Step) String() string { return s.Op.String() + " " + s.Member }

// MustParseSteps reads steps as ParseStep does, and panics on one it cannot read: for plans written
// out in code (tests, examples), as regexp.MustCompile is for patterns.
func MustParseSteps(texts ...string) []Step {
	out := make([]Step, len(texts))
	for i, t := range texts {
		s, err := ParseStep(t)
		if err != nil {
			panic(err)
		}
		out[i] = s
	}
	return out
}

// ParseStep reads a step as String writes it: "power-cycle etcd-2".
func ParseStep(text string) (Step, error) {
	name, member, _ := strings.Cut(strings.TrimSpace(text), " ")
	for o := OpPowerCycle; o.valid(); o++ {
		if o.String() == name && member != "" && !strings.ContainsAny(member, " \t") {
			return Step{o, member}, nil
		}
	}
	return Step{}, fmt.Errorf("step %q: want an operation and a member, like \"power-cycle etcd-2\" "+
		"(operations: power-cycle, power-off, await-healthy, add-learner, promote, add-voter, remove)", text)
}

// MarshalText writes the step as String does.
func (s Step) MarshalText() ([]byte, error) {
	if !s.Op.valid() || s.Member == "" {
		return nil, fmt.Errorf("step %v: not a step", s)
	}
	return []byte(s.String()), nil
}

// UnmarshalText reads the step as ParseStep does.
func (s *Step) UnmarshalText(b []byte) error {
	v, err := ParseStep(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

func (s Step) describe() string {
	_, gerund := s.Op.names()
	return gerund + " " + s.Member
}

// Apply returns the cluster after step s, assuming the worst at the moment the step is taken: a
// power-cycled member is down, a new member is not healthy yet. Only OpAwaitHealthy brings a member
// up. Apply checks structure only (the member exists, or does not yet for an add); Check also checks
// quorum. c is not changed.
func (c Cluster) Apply(s Step) (Cluster, error) {
	ms, err := applyStep(c.withRoom(), s)
	if err != nil {
		return c, err
	}
	return Cluster{Members: ms}, nil
}

// withRoom copies c's members with room for one more, so that a step can be applied in place.
func (c Cluster) withRoom() []Member {
	ms := make([]Member, len(c.Members), len(c.Members)+1)
	copy(ms, c.Members)
	return ms
}

// applyStep applies s to ms in place and returns the result. On error ms is unchanged.
// (Functions on slices rather than methods on *Cluster: the compiler then keeps a caller's scratch
// buffer on the stack.)
func applyStep(ms []Member, s Step) ([]Member, error) {
	if !s.Op.valid() {
		return ms, fmt.Errorf("step %v: unknown operation", s)
	}
	if s.Member == "" {
		return ms, fmt.Errorf("step %v: no member named", s)
	}
	i := Cluster{ms}.Index(s.Member)
	if s.Op == OpAddLearner || s.Op == OpAddVoter {
		if i >= 0 {
			return ms, fmt.Errorf("%s: member %s already exists", s.describe(), s.Member)
		}
		return append(ms, Member{Name: s.Member, Learner: s.Op == OpAddLearner, Health: Unhealthy}), nil
	}
	if i < 0 {
		return ms, fmt.Errorf("%s: no member named %s", s.describe(), s.Member)
	}
	m := &ms[i]
	switch s.Op {
	case OpPowerCycle:
		m.Disruption = InFlight
	case OpPowerOff:
		m.Disruption = Fenced
	case OpAwaitHealthy:
		m.Health, m.Disruption = Healthy, NotDisrupted
	case OpPromote:
		if !m.Learner {
			return ms, fmt.Errorf("%s: %s is already a voter", s.describe(), s.Member)
		}
		m.Learner = false
	case OpRemove:
		ms = append(ms[:i], ms[i+1:]...)
	}
	return ms, nil
}

// Check returns the cluster after step s if policy p allows the step from c, or a *Refusal naming the
// rule it breaks and the numbers. Call it with the live membership immediately before every
// irreversible step; other remediations in flight must be marked InFlight in c. c is not changed.
func (c Cluster) Check(p Policy, s Step) (Cluster, error) {
	ms, _, err := checkStep(c.withRoom(), p, s)
	if err != nil {
		return c, err
	}
	return Cluster{Members: ms}, nil
}

// checkStep applies s to ms in place if p allows it, and returns the result and the budget after it.
// On a refusal ms may have been changed.
func checkStep(ms []Member, p Policy, s Step) ([]Member, Budget, error) {
	before := Cluster{ms}.Budget(p)
	if v := precondition(ms, p, s, before); v != 0 {
		return ms, before, &Refusal{Violation: v, Step: s, Before: before, After: before, Policy: p}
	}
	// A step that takes down or removes a voter of unknown health is judged from the budget in which
	// that voter is up: nothing shows it down, and if it is up the step costs a healthy voter. (Counted
	// as not healthy, as everywhere else, the step would look free even with quorum held by one vote.)
	judged, counted := before, ""
	if i := unknownVoter(ms, s); i >= 0 {
		ms[i].Health = Healthy
		judged, counted = Cluster{ms}.Budget(p), s.Member
		ms[i].Health = HealthUnknown
	}
	ms, err := applyStep(ms, s)
	if err != nil {
		return ms, before, err
	}
	after := Cluster{ms}.Budget(p)
	if after.FaultTolerance < judged.FaultTolerance {
		v := Violation(0)
		switch {
		case after.FaultTolerance < 0:
			v = BelowQuorum
		case after.FaultTolerance < p.MinFaultTolerance:
			v = BelowFaultTolerance
		}
		if v != 0 {
			return ms, before, &Refusal{Violation: v, Step: s, Before: judged, After: after, Policy: p, CountedUp: counted}
		}
	}
	return ms, after, nil
}

// unknownVoter is the index in ms of the voter of unknown health that step s takes down or removes
// (one Hale is not disrupting yet), or -1.
func unknownVoter(ms []Member, s Step) int {
	if s.Op != OpPowerCycle && s.Op != OpPowerOff && s.Op != OpRemove {
		return -1
	}
	i := Cluster{ms}.Index(s.Member)
	if i < 0 || ms[i].Learner || ms[i].Health != HealthUnknown || ms[i].Disruption != NotDisrupted {
		return -1
	}
	return i
}

// precondition returns the rule, other than the counts after it, that forbids step s from ms.
func precondition(ms []Member, p Policy, s Step, before Budget) Violation {
	if s.Op.ChangesMembership() && before.QuorumLost() {
		return QuorumLost
	}
	i := Cluster{ms}.Index(s.Member)
	if i >= 0 {
		m := ms[i]
		switch {
		case s.Op == OpRemove && !m.Learner && before.Voters == 1:
			return LastVoter
		case s.Op == OpPromote && m.Learner && !(m.Health == Healthy && m.Disruption == NotDisrupted):
			return LearnerNotReady
		}
	}
	if s.Op == OpAddLearner && i < 0 && before.Learners >= p.MaxLearners {
		return LearnerLimit
	}
	return 0
}
