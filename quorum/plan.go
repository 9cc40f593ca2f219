package quorum

import (
	"fmt"
	"strings"
)

// Strategy is how a machine is healed.
type Strategy uint8

const (
	// Reboot power-cycles the machine in place through its BMC: no membership change.
	Reboot Strategy = iota + 1
	// Fence powers the machine off and verifies it is off; it stays off.
	Fence
	// Replace has the owner controller replace the machine; the etcd member is replaced with it.
	Replace
)

func (s Strategy) String() string {
	switch s {
	case Reboot:
		return "reboot"
	case Fence:
		return "fence"
	case Replace:
		return "replace"
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// firstOp is the operation a strategy starts with on the member it heals.
func (s Strategy) firstOp() Op {
	switch s {
	case Fence:
		return OpPowerOff
	case Replace:
		return OpRemove
	}
	return OpPowerCycle
}

// ParseStrategy reads "reboot", "fence" or "replace".
func ParseStrategy(s string) (Strategy, error) {
	for _, v := range []Strategy{Reboot, Fence, Replace} {
		if s == v.String() {
			return v, nil
		}
	}
	return 0, fmt.Errorf("strategy %q: want reboot, fence or replace", s)
}

// Order is which comes first when a member is replaced.
type Order uint8

const (
	// ScaleUpFirst adds the new member before removing the old one.
	ScaleUpFirst Order = iota + 1
	// ScaleDownFirst removes the old member before adding the new one.
	ScaleDownFirst
)

// Join is how a new member enters the cluster: a fact about the owner controller (kubeadm joins as a
// learner when its EtcdLearnerMode is on), not a choice Hale makes.
type Join uint8

const (
	// JoinAsLearner adds the new member as a learner and promotes it once it is in sync.
	JoinAsLearner Join = iota + 1
	// JoinAsVoter adds the new member as a voter straight away.
	JoinAsVoter
)

// Shape is one way of replacing a member.
type Shape struct {
	Order Order
	Join  Join
}

func (s Shape) String() string {
	order := "scale-down-first"
	if s.Order == ScaleUpFirst {
		order = "scale-up-first"
	}
	join := "voter"
	if s.Join == JoinAsLearner {
		join = "learner"
	}
	return order + " (new member joins as " + join + ")"
}

// Steps returns the shape's steps for replacing old by new.
func (s Shape) Steps(old, new string) []Step {
	steps := make([]Step, 0, 4)
	if s.Order == ScaleDownFirst {
		steps = append(steps, Step{OpRemove, old})
	}
	if s.Join == JoinAsLearner {
		steps = append(steps, Step{OpAddLearner, new}, Step{OpAwaitHealthy, new}, Step{OpPromote, new})
	} else {
		steps = append(steps, Step{OpAddVoter, new}, Step{OpAwaitHealthy, new})
	}
	if s.Order == ScaleUpFirst {
		steps = append(steps, Step{OpRemove, old})
	}
	return steps
}

// ReplaceOptions says what the owner controller can do when it replaces a machine.
type ReplaceOptions struct {
	// NewMember is the name the replacement's etcd member will have.
	NewMember string
	// Orders the owner allows, most preferred first. Empty means both, scale up first.
	Orders []Order
	// Join is how the owner's new member joins. Zero means JoinAsLearner.
	Join Join
}

// Plan is an ordered list of steps that keeps quorum at every step.
type Plan struct {
	Strategy Strategy
	Member   string
	// Shape is how a Replace plan proceeds; zero for the other strategies.
	Shape Shape
	Steps []Step
	// Cost is how many healthy voters the plan takes away at its worst point: 0 for a member that is
	// not a healthy voter (rule 3 of DESIGN.md), 1 for rebooting a healthy voter.
	Cost int
}

func (p Plan) String() string {
	return fmt.Sprintf("%s %s (cost %d): %s", p.Strategy, p.Member, p.Cost, p.StepList())
}

// StepStrings returns each step as text ("power-cycle etcd-2"), as the journal keeps them.
func (p Plan) StepStrings() []string {
	out := make([]string, len(p.Steps))
	for i, s := range p.Steps {
		out[i] = s.String()
	}
	return out
}

// StepList returns the steps as one line: "power-cycle etcd-2 → await-healthy etcd-2".
func (p Plan) StepList() string { return StepList(p.Steps) }

// StepList returns steps as one line: "power-cycle etcd-2 → await-healthy etcd-2".
func StepList(steps []Step) string {
	var b strings.Builder
	for i, s := range steps {
		if i > 0 {
			b.WriteString(" → ")
		}
		b.WriteString(s.String())
	}
	return b.String()
}

// Simulate checks every step of steps in order from c under policy p and returns the cost: how far the
// fault tolerance drops below its starting value at the worst point. The first refused step is returned
// as a *Refusal. A voter of unknown health that the steps take down counts as up until they do (as
// checkStep judges that step), so that taking it down costs one.
func (c Cluster) Simulate(p Policy, steps []Step) (int, error) {
	var buf [16]Member // typical clusters fit: no allocation
	scratch := append(buf[:0], c.Members...)
	up := 0 // 1 while such a voter is counted up
	for _, s := range steps {
		if unknownVoter(scratch, s) >= 0 {
			up = 1
		}
	}
	start := c.Budget(p).FaultTolerance + up
	lowest := start
	for _, s := range steps {
		if unknownVoter(scratch, s) >= 0 {
			up = 0
		}
		var after Budget
		var err error
		if scratch, after, err = checkStep(scratch, p, s); err != nil {
			return 0, err
		}
		lowest = min(lowest, after.FaultTolerance+up)
	}
	return start - lowest, nil
}

// target returns the member called name, or an error saying it is not there.
func (c Cluster) target(name string) (Member, error) {
	i := c.Index(name)
	if i < 0 {
		return Member{}, fmt.Errorf("no etcd member named %q in the membership (%d members)", name, len(c.Members))
	}
	return c.Members[i], nil
}

func (c Cluster) planFor(p Policy, strategy Strategy, member string, steps []Step) (Plan, error) {
	m, err := c.target(member)
	if err != nil {
		return Plan{}, err
	}
	if m.Disruption == InFlight {
		return Plan{}, c.refusal(p, AlreadyInFlight, Step{steps[0].Op, member})
	}
	cost, err := c.Simulate(p, steps)
	if err != nil {
		return Plan{}, err
	}
	return Plan{Strategy: strategy, Member: member, Steps: steps, Cost: cost}, nil
}

// PlanReboot plans a reboot in place of member: power-cycle, then wait until it is healthy again. It is
// free for a member that is not a healthy voter and costs one for a healthy voter.
func (c Cluster) PlanReboot(p Policy, member string) (Plan, error) {
	return c.planFor(p, Reboot, member, Reboot.steps(member, "", Shape{}))
}

// PlanFence plans powering member's machine off for good, for a machine whose state is unknown or that
// must not come back. Free for a member that is not a healthy voter.
func (c Cluster) PlanFence(p Policy, member string) (Plan, error) {
	return c.planFor(p, Fence, member, Fence.steps(member, "", Shape{}))
}

// steps are strategy s's steps on target (an etcd member, or a machine that runs none); a replace's,
// by replacement in shape. The one place a strategy's steps are written.
func (s Strategy) steps(target, replacement string, shape Shape) []Step {
	switch s {
	case Fence:
		return []Step{{OpPowerOff, target}}
	case Replace:
		return shape.Steps(target, replacement)
	}
	return []Step{{OpPowerCycle, target}, {OpAwaitHealthy, target}}
}

// PlanMachine plans strategy s for a machine that runs no etcd member: there is no quorum to keep
// (the planner applies its pool's limits). A replace is the owner's: it makes replacement first when
// it prefers to scale up first, else it removes the machine.
func PlanMachine(s Strategy, machine, replacement string, opts ReplaceOptions) Plan {
	p := Plan{Strategy: s, Member: machine}
	switch {
	case s == Replace && len(opts.Orders) > 0 && opts.Orders[0] == ScaleUpFirst:
		p.Shape = Shape{Order: ScaleUpFirst, Join: JoinAsVoter}
		p.Steps = s.steps(machine, replacement, p.Shape)
	case s == Replace:
		p.Steps = []Step{{OpRemove, machine}}
	default:
		p.Steps = s.steps(machine, "", Shape{})
	}
	return p
}

// PlanReplace plans replacing old by opts.NewMember, trying each order the owner allows (most preferred
// first) with the owner's join mode, and returns the first that keeps quorum at every step. Scale up
// first is therefore chosen only where it is safe: the new member joins as a learner, or the cluster
// has a healthy voter to spare while the new voter catches up. When no way is safe, the error is a
// *ReplaceRefusal with one reason per way.
func (c Cluster) PlanReplace(p Policy, old string, opts ReplaceOptions) (Plan, error) {
	m, err := c.target(old)
	if err != nil {
		return Plan{}, err
	}
	if opts.NewMember == "" || opts.NewMember == old {
		return Plan{}, fmt.Errorf("replacing %s: the new member needs a name of its own (got %q)", old, opts.NewMember)
	}
	orders := opts.Orders
	if len(orders) == 0 {
		orders = []Order{ScaleUpFirst, ScaleDownFirst}
	}
	join := opts.Join
	if join == 0 {
		join = JoinAsLearner
	}
	if join != JoinAsLearner && join != JoinAsVoter {
		return Plan{}, fmt.Errorf("replacing %s: unknown join mode %d", old, join)
	}
	for _, o := range orders {
		if o != ScaleUpFirst && o != ScaleDownFirst {
			return Plan{}, fmt.Errorf("replacing %s: unknown order %d", old, o)
		}
	}
	if m.Disruption == InFlight {
		return Plan{}, c.refusal(p, AlreadyInFlight, Step{OpRemove, old})
	}
	refused := &ReplaceRefusal{Member: old}
	for _, order := range orders {
		shape := Shape{Order: order, Join: join}
		steps := shape.Steps(old, opts.NewMember)
		if m.Learner {
			refused.Shapes = append(refused.Shapes, ShapeRefusal{shape, c.refusal(p, NotAVoter, Step{OpRemove, old})})
			continue
		}
		plan, err := c.planFor(p, Replace, old, steps)
		if err != nil {
			r, ok := err.(*Refusal)
			if !ok {
				return Plan{}, err
			}
			refused.Shapes = append(refused.Shapes, ShapeRefusal{shape, r})
			continue
		}
		plan.Shape = shape
		return plan, nil
	}
	return Plan{}, refused
}

// PlanFor plans strategy s for member (Reboot, Fence or Replace).
func (c Cluster) PlanFor(p Policy, s Strategy, member string, opts ReplaceOptions) (Plan, error) {
	switch s {
	case Reboot:
		return c.PlanReboot(p, member)
	case Fence:
		return c.PlanFence(p, member)
	case Replace:
		return c.PlanReplace(p, member, opts)
	}
	return Plan{}, fmt.Errorf("planning %s: unknown strategy %v", member, s)
}
