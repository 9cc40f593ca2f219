// Package quorum is Hale's decision core: how much disruption an etcd cluster can take right now, and
// which ordered steps heal a machine without ever taking the count of healthy voters below quorum by
// Hale's own action.
//
// It is pure: no I/O, no clocks, no goroutines. Callers describe the cluster as they see it (members,
// their health, which of them Hale is already disrupting) and get back a Plan or a *Refusal whose
// message names the numbers that forbid the step.
//
// The counting rules:
//   - Only voters count toward quorum; learners never do.
//   - quorum(n) = n/2 + 1 for n voters.
//   - A voter counts as healthy only when its etcd health is Healthy and Hale is not disrupting it
//     (no remediation in flight, not fenced). Unknown health is not healthy: the count is a lower bound
//     of the real number of healthy voters, so a plan that keeps the lower bound at quorum keeps the
//     real cluster there too.
//   - A step may lower the fault tolerance (healthy voters − quorum) only while it stays ≥ 0 and ≥ the
//     policy's MinFaultTolerance. A step that does not lower it (power-cycling a dead member) is always
//     allowed, even when quorum is already lost: that is the only way out of a lost quorum.
//   - A step that takes down or removes a voter of unknown health is judged as if that voter were up:
//     nothing shows it down, and if it is up the step costs a healthy voter.
//   - Membership changes (add, promote, remove) need a committed raft entry, so they are refused while
//     quorum is lost.
package quorum

import (
	"fmt"
	"strings"
)

// Health is a member's etcd health as observed (by agents, by etcd's own status).
type Health uint8

const (
	// HealthUnknown means nobody can say: never counted as healthy.
	HealthUnknown Health = iota
	// Healthy means the member answers and is in sync.
	Healthy
	// Unhealthy means the member is down, unreachable or out of sync.
	Unhealthy
)

func (h Health) String() string {
	switch h {
	case HealthUnknown:
		return "unknown"
	case Healthy:
		return "healthy"
	case Unhealthy:
		return "unhealthy"
	}
	return fmt.Sprintf("Health(%d)", uint8(h))
}

// Disruption is what Hale itself is doing to a member's machine.
type Disruption uint8

const (
	// NotDisrupted means Hale is not acting on the machine.
	NotDisrupted Disruption = iota
	// InFlight means a remediation is under way: the machine may be down at any moment.
	InFlight
	// Fenced means the machine was powered off on purpose and verified off.
	Fenced
)

func (d Disruption) String() string {
	switch d {
	case NotDisrupted:
		return "none"
	case InFlight:
		return "in-flight"
	case Fenced:
		return "fenced"
	}
	return fmt.Sprintf("Disruption(%d)", uint8(d))
}

// Member is one etcd member as Hale sees it.
type Member struct {
	Name       string
	Learner    bool
	Health     Health
	Disruption Disruption
}

// CountsHealthy reports whether m counts toward quorum now: a voter, healthy, and not disrupted by Hale.
func (m Member) CountsHealthy() bool {
	return !m.Learner && m.Health == Healthy && m.Disruption == NotDisrupted
}

func (m Member) String() string {
	role := "voter"
	if m.Learner {
		role = "learner"
	}
	s := fmt.Sprintf("%s(%s,%s", m.Name, role, m.Health)
	if m.Disruption != NotDisrupted {
		s += "," + m.Disruption.String()
	}
	return s + ")"
}

// Cluster is an etcd cluster's membership as Hale sees it. The zero value is an empty cluster.
type Cluster struct {
	Members []Member
}

// Quorum returns how many voters a cluster of n voters needs to commit: n/2 + 1.
func Quorum(voters int) int { return voters/2 + 1 }

// Index returns the position of the member called name, or -1.
func (c Cluster) Index(name string) int {
	for i := range c.Members {
		if c.Members[i].Name == name {
			return i
		}
	}
	return -1
}

// Clone returns a deep copy of c.
func (c Cluster) Clone() Cluster {
	return Cluster{Members: append([]Member(nil), c.Members...)}
}

// Budget is how much disruption the cluster can take now.
type Budget struct {
	Voters        int `json:"voters"`
	Learners      int `json:"learners"`
	HealthyVoters int `json:"healthyVoters"`
	Quorum        int `json:"quorum"`
	// FaultTolerance is HealthyVoters − Quorum: how many more healthy voters may be lost before quorum
	// is. Negative when quorum is already lost.
	FaultTolerance int `json:"faultTolerance"`
	// Available is how many more healthy voters Hale may disrupt now: FaultTolerance minus the policy's
	// MinFaultTolerance, never below 0.
	Available int `json:"available"`
}

// QuorumLost reports whether fewer voters are healthy than quorum needs.
func (b Budget) QuorumLost() bool { return b.FaultTolerance < 0 }

func (b Budget) String() string {
	if b.QuorumLost() {
		return fmt.Sprintf("quorum lost: %d of %d voters healthy, quorum needs %d", b.HealthyVoters, b.Voters, b.Quorum)
	}
	return fmt.Sprintf("%d of %d voters healthy, quorum %d, tolerates %d, budget %d",
		b.HealthyVoters, b.Voters, b.Quorum, b.FaultTolerance, b.Available)
}

// Budget returns how much disruption c can take now under policy p.
func (c Cluster) Budget(p Policy) Budget {
	var b Budget
	for _, m := range c.Members {
		if m.Learner {
			b.Learners++
			continue
		}
		b.Voters++
		if m.CountsHealthy() {
			b.HealthyVoters++
		}
	}
	b.Quorum = Quorum(b.Voters)
	b.FaultTolerance = b.HealthyVoters - b.Quorum
	b.Available = max(0, b.FaultTolerance-max(0, p.MinFaultTolerance))
	return b
}

func (c Cluster) String() string {
	parts := make([]string, len(c.Members))
	for i, m := range c.Members {
		parts[i] = m.String()
	}
	return "[" + strings.Join(parts, " ") + "]"
}
