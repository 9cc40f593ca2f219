package inventory

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/config"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// PolicyOverride is a policy given apart from the inventory (Kubernetes mode's HealthPolicy spec):
// each field that is set replaces the inventory's, which stands where it is not.
type PolicyOverride struct {
	MinFaultTolerance         *int
	MaxInFlight, MaxUnhealthy *quorum.Limit
	// ProbeTimeouts replace the inventory's for the probes they name.
	ProbeTimeouts map[string]time.Duration
	Cooldown      *time.Duration
	MaxAttempts   *int
	// StallTolerance and ComponentGrace replace the inventory's waits they set.
	StallTolerance, ComponentGrace PerQuorumOverride
}

// PerQuorumOverride sets the waits of a pass.PerQuorum it has (nil: the inventory's).
type PerQuorumOverride struct{ Held, Needed *time.Duration }

func (o PerQuorumOverride) apply(w pass.PerQuorum) pass.PerQuorum {
	if o.Held != nil {
		w.Held = *o.Held
	}
	if o.Needed != nil {
		w.Needed = *o.Needed
	}
	return w
}

func (o PerQuorumOverride) set() bool { return o.Held != nil || o.Needed != nil }

// Apply returns p with the override's fields in it.
func (o PolicyOverride) Apply(p pass.Policy) pass.Policy {
	if o.MinFaultTolerance != nil {
		p.Quorum.MinFaultTolerance = *o.MinFaultTolerance
	}
	if o.MaxInFlight != nil {
		p.Quorum.Pools.MaxInFlight = *o.MaxInFlight
	}
	if o.MaxUnhealthy != nil {
		p.Quorum.Pools.MaxUnhealthy = *o.MaxUnhealthy
	}
	if len(o.ProbeTimeouts) > 0 {
		p.Assess.ProbeTimeouts = maps.Clone(p.Assess.ProbeTimeouts)
		if p.Assess.ProbeTimeouts == nil {
			p.Assess.ProbeTimeouts = map[string]time.Duration{}
		}
		maps.Copy(p.Assess.ProbeTimeouts, o.ProbeTimeouts)
	}
	if o.Cooldown != nil {
		p.Cooldown = *o.Cooldown
	}
	if o.MaxAttempts != nil {
		p.MaxAttempts = *o.MaxAttempts
	}
	p.StallTolerance, p.ComponentGrace = o.StallTolerance.apply(p.StallTolerance), o.ComponentGrace.apply(p.ComponentGrace)
	return p
}

// Fields names the fields the override sets (as the HealthPolicy spells them).
func (o PolicyOverride) Fields() []string {
	var out []string
	for _, f := range []struct {
		name string
		set  bool
	}{{"minFaultTolerance", o.MinFaultTolerance != nil}, {"maxInFlight", o.MaxInFlight != nil}, {"maxUnhealthy", o.MaxUnhealthy != nil},
		{"probeTimeouts", len(o.ProbeTimeouts) > 0}, {"cooldown", o.Cooldown != nil}, {"maxAttempts", o.MaxAttempts != nil},
		{"stallTolerance", o.StallTolerance.set()}, {"componentGrace", o.ComponentGrace.set()}} {
		if f.set {
			out = append(out, f.name)
		}
	}
	return out
}

// EffectivePolicy is the policy in force, as `hub status` shows it: the fields an operator tunes,
// and which of them an override (the HealthPolicy) sets.
type EffectivePolicy struct {
	MinFaultTolerance int                        `json:"minFaultTolerance"`
	MaxInFlight       string                     `json:"maxInFlight"`
	MaxUnhealthy      string                     `json:"maxUnhealthy"`
	ProbeTimeouts     map[string]config.Duration `json:"probeTimeouts,omitempty"`
	Cooldown          config.Duration            `json:"cooldown"`
	MaxAttempts       int                        `json:"maxAttempts"`
	StallTolerance    QuorumWaits                `json:"stallTolerance"`
	ComponentGrace    QuorumWaits                `json:"componentGrace"`
	// Overridden names the fields set by the override; the others are the inventory's.
	Overridden []string `json:"overridden,omitempty"`
}

// QuorumWaits is a pass.PerQuorum as status shows it.
type QuorumWaits struct {
	QuorumHeld   config.Duration `json:"quorumHeld"`
	QuorumNeeded config.Duration `json:"quorumNeeded"`
}

func waitsOf(w pass.PerQuorum) QuorumWaits {
	return QuorumWaits{QuorumHeld: config.Duration{Duration: w.Held}, QuorumNeeded: config.Duration{Duration: w.Needed}}
}

// EffectiveOf is policy p as status shows it, overridden naming the fields an override set.
func EffectiveOf(p pass.Policy, overridden []string) EffectivePolicy {
	e := EffectivePolicy{MinFaultTolerance: p.Quorum.MinFaultTolerance, MaxInFlight: p.Quorum.Pools.MaxInFlight.String(),
		MaxUnhealthy: p.Quorum.Pools.MaxUnhealthy.String(), Cooldown: config.Duration{Duration: p.Cooldown},
		MaxAttempts: p.MaxAttempts, StallTolerance: waitsOf(p.StallTolerance), ComponentGrace: waitsOf(p.ComponentGrace), Overridden: overridden}
	if len(p.Assess.ProbeTimeouts) > 0 {
		e.ProbeTimeouts = map[string]config.Duration{}
		for probe, d := range p.Assess.ProbeTimeouts {
			e.ProbeTimeouts[probe] = config.Duration{Duration: d}
		}
	}
	return e
}

func (e EffectivePolicy) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "minFaultTolerance %d, maxInFlight %s, maxUnhealthy %s, cooldown %v, maxAttempts %d, stallTolerance %v (%v when its member is needed for quorum), "+
		"componentGrace %v (%v)", e.MinFaultTolerance, e.MaxInFlight, e.MaxUnhealthy, e.Cooldown, e.MaxAttempts,
		e.StallTolerance.QuorumHeld, e.StallTolerance.QuorumNeeded, e.ComponentGrace.QuorumHeld, e.ComponentGrace.QuorumNeeded)
	for _, p := range slices.Sorted(maps.Keys(e.ProbeTimeouts)) {
		fmt.Fprintf(&b, ", probe %s %v", p, e.ProbeTimeouts[p])
	}
	if len(e.Overridden) > 0 {
		fmt.Fprintf(&b, " (overridden: %s; the rest from the inventory)", strings.Join(e.Overridden, ", "))
	}
	return b.String()
}
