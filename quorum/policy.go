package quorum

import (
	"fmt"
	"strconv"
	"strings"
)

// Policy holds the knobs that make Hale more careful than etcd's bare rules.
type Policy struct {
	// MinFaultTolerance is the headroom Hale keeps: a step that lowers the fault tolerance may not take
	// it below this (0 means "never below quorum", etcd's own line).
	MinFaultTolerance int
	// MaxLearners is etcd's learner limit (its --max-learners, 1 by default). 0 forbids learner paths.
	MaxLearners int
	// Pools caps remediation of machines that are not etcd members, per pool.
	Pools PoolLimits
}

// PoolLimits caps remediation of machines that are not etcd members (workers, or control-plane nodes
// over external etcd), counted within each pool, like MachineHealthCheck's maxUnhealthy.
type PoolLimits struct {
	// MaxInFlight caps remediations running at once in a pool. A percentage rounds down but allows at
	// least one. Unset means no cap.
	MaxInFlight Limit
	// MaxUnhealthy short-circuits a pool: when more machines are unhealthy than this, none is remediated
	// (something bigger than one machine is wrong). A percentage rounds down, like MachineHealthCheck.
	// Unset means no cap.
	MaxUnhealthy Limit
}

// DefaultPolicy is what Hale uses when the operator says nothing: etcd's own quorum line, etcd's default
// learner limit, and pools capped at 10 % in flight (at least one) and short-circuited past 40 % unhealthy.
func DefaultPolicy() Policy {
	return Policy{
		MinFaultTolerance: 0,
		MaxLearners:       1,
		Pools:             PoolLimits{MaxInFlight: Percent(10), MaxUnhealthy: Percent(40)},
	}
}

// Validate reports the first field that is out of range.
func (p Policy) Validate() error {
	if p.MinFaultTolerance < 0 {
		return fmt.Errorf("minFaultTolerance: %d is negative; use 0 for etcd's own quorum line", p.MinFaultTolerance)
	}
	if p.MaxLearners < 0 {
		return fmt.Errorf("maxLearners: %d is negative; etcd's default is 1", p.MaxLearners)
	}
	return nil
}

// Limit is a count ("3") or a percentage ("40%") of a pool, or unset (no limit). The zero value is unset.
type Limit struct {
	value   int
	percent bool
	set     bool
}

// Count returns a limit of n machines.
func Count(n int) Limit { return Limit{value: n, set: true} }

// Percent returns a limit of p percent of a pool.
func Percent(p int) Limit { return Limit{value: p, percent: true, set: true} }

// IsSet reports whether l limits anything.
func (l Limit) IsSet() bool { return l.set }

// Of returns the limit for a pool of total machines; -1 when unset. Percentages round down.
func (l Limit) Of(total int) int {
	if !l.set {
		return -1
	}
	if l.percent {
		return total * l.value / 100
	}
	return l.value
}

func (l Limit) String() string {
	switch {
	case !l.set:
		return "unlimited"
	case l.percent:
		return strconv.Itoa(l.value) + "%"
	}
	return strconv.Itoa(l.value)
}

// ParseLimit reads "3", "40%", or "" (unset).
func ParseLimit(s string) (Limit, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Limit{}, nil
	}
	num, pct := strings.CutSuffix(s, "%")
	n, err := strconv.Atoi(num)
	switch {
	case err != nil:
		return Limit{}, fmt.Errorf("limit %q: want a count like \"3\" or a percentage like \"40%%\"", s)
	case n < 0:
		return Limit{}, fmt.Errorf("limit %q: must not be negative", s)
	case pct && n > 100:
		return Limit{}, fmt.Errorf("limit %q: a percentage must be at most 100%%", s)
	case pct:
		return Percent(n), nil
	}
	return Count(n), nil
}

// MarshalText writes the limit as ParseLimit reads it.
func (l Limit) MarshalText() ([]byte, error) {
	if !l.set {
		return nil, nil
	}
	return []byte(l.String()), nil
}

// UnmarshalText reads the limit as ParseLimit does.
func (l *Limit) UnmarshalText(b []byte) error {
	v, err := ParseLimit(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}
