package quorum

import (
	"fmt"
	"strings"
)

// Violation is the rule a refused step would break.
type Violation uint8

const (
	// BelowQuorum: the step would leave fewer healthy voters than quorum needs.
	BelowQuorum Violation = iota + 1
	// BelowFaultTolerance: the step would leave less headroom than Policy.MinFaultTolerance.
	BelowFaultTolerance
	// QuorumLost: a membership change was asked for while quorum is lost; it cannot commit.
	QuorumLost
	// LastVoter: the step would remove the last voter.
	LastVoter
	// LearnerLimit: adding a learner would exceed etcd's learner limit.
	LearnerLimit
	// LearnerNotReady: promoting a learner that is not healthy and in sync (etcd refuses it).
	LearnerNotReady
	// AlreadyInFlight: the member already has a remediation in flight.
	AlreadyInFlight
	// NotAVoter: replacing a learner (learners are transient; remove it instead).
	NotAVoter
	// MembershipChangeInFlight: another membership change is already under way (they are serialised).
	MembershipChangeInFlight
)

func (v Violation) String() string {
	switch v {
	case BelowQuorum:
		return "BelowQuorum"
	case BelowFaultTolerance:
		return "BelowFaultTolerance"
	case QuorumLost:
		return "QuorumLost"
	case LastVoter:
		return "LastVoter"
	case LearnerLimit:
		return "LearnerLimit"
	case LearnerNotReady:
		return "LearnerNotReady"
	case AlreadyInFlight:
		return "AlreadyInFlight"
	case NotAVoter:
		return "NotAVoter"
	case MembershipChangeInFlight:
		return "MembershipChangeInFlight"
	}
	return fmt.Sprintf("Violation(%d)", uint8(v))
}

// countsShape reports whether the violation depends on the way a replace proceeds (and so is worth
// giving per way) rather than on the cluster alone.
func (v Violation) countsShape() bool {
	return v != QuorumLost && v != AlreadyInFlight && v != NotAVoter
}

// Refusal says why a step may not be taken, with the numbers that forbid it.
type Refusal struct {
	Violation Violation
	Step      Step
	// Before is the budget when the step was asked for; After the budget the step would leave (equal to
	// Before for violations that are not about counts).
	Before, After Budget
	Policy        Policy
	// CountedUp names the member of unknown health the step takes down or removes, when Before counts
	// it healthy: a step on it is judged as if it were up, since nothing shows that it is not.
	CountedUp string
}

// refusal is a refusal for a rule that is not about the counts after the step: Before and After are
// both c's budget.
func (c Cluster) refusal(p Policy, v Violation, s Step) *Refusal {
	b := c.Budget(p)
	return &Refusal{Violation: v, Step: s, Before: b, After: b, Policy: p}
}

func (r *Refusal) Error() string {
	what := r.Step.describe()
	b, a := r.Before, r.After
	counted := ""
	if r.CountedUp != "" {
		counted = fmt.Sprintf(" (%s's health is unknown: nothing shows it down, so the step is judged as if it were up)", r.CountedUp)
	}
	switch r.Violation {
	case BelowQuorum:
		return fmt.Sprintf("%s leaves %d of %d voters healthy; quorum needs %d%s", what, a.HealthyVoters, a.Voters, a.Quorum, counted)
	case BelowFaultTolerance:
		return fmt.Sprintf("%s leaves %d of %d voters healthy, tolerating %d failure(s); policy minFaultTolerance needs %d%s",
			what, a.HealthyVoters, a.Voters, a.FaultTolerance, r.Policy.MinFaultTolerance, counted)
	case QuorumLost:
		return fmt.Sprintf("%s changes membership, but etcd has lost quorum (%d of %d voters healthy, quorum needs %d) "+
			"and cannot commit it; power-cycling the dead members is the only way out", what, b.HealthyVoters, b.Voters, b.Quorum)
	case LastVoter:
		return fmt.Sprintf("%s would remove the last voter", what)
	case LearnerLimit:
		return fmt.Sprintf("%s: etcd already has %d learner(s), max %d", what, b.Learners, r.Policy.MaxLearners)
	case LearnerNotReady:
		return fmt.Sprintf("%s: the learner is not healthy and in sync yet, and etcd refuses to promote it", what)
	case AlreadyInFlight:
		return fmt.Sprintf("%s already has a remediation in flight", r.Step.Member)
	case NotAVoter:
		return fmt.Sprintf("%s is a learner: replace applies to voters (remove the learner instead)", r.Step.Member)
	case MembershipChangeInFlight:
		return fmt.Sprintf("%s: an etcd membership change is in flight; other membership changes and disruptions of healthy voters wait until it is done", what)
	}
	return fmt.Sprintf("%s: refused (%v)", what, r.Violation)
}

// ShapeRefusal is why one way of replacing a member is unsafe.
type ShapeRefusal struct {
	Shape  Shape
	Reason *Refusal
}

// ReplaceRefusal says why no allowed way of replacing a member is safe now, one reason per way.
type ReplaceRefusal struct {
	Member string
	Shapes []ShapeRefusal
}

func (r *ReplaceRefusal) Error() string {
	if len(r.Shapes) > 0 && !r.Shapes[0].Reason.Violation.countsShape() {
		// Quorum lost, an in-flight member, a learner: the same for every way, so say it once.
		return fmt.Sprintf("no safe way to replace %s now: %v", r.Member, r.Shapes[0].Reason)
	}
	parts := make([]string, len(r.Shapes))
	for i, s := range r.Shapes {
		parts[i] = s.Shape.String() + ": " + s.Reason.Error()
	}
	return fmt.Sprintf("no safe way to replace %s now: %s", r.Member, strings.Join(parts, "; "))
}
