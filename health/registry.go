package health

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/config"
)

// A probe is one file: the file that implements it registers its kind (RegisterProbe, from its init),
// and everything else reads the registry: the agent's config (a section under probes: by the kind's
// name, with the kind's defaults), the probes an agent runs, the hub's default probe timeouts, the
// inventory's check of policy.probeTimeouts, and the agent's reference page (docs/reference/agent.md, generated). Adding a probe
// is its file and its test.

// ProbeKind is one kind of probe.
type ProbeKind struct {
	// Name is its section under probes: in the agent's config, and the name its results carry.
	Name string
	// Help says in a line what it checks, for the agent's reference page.
	Help string
	// Interval and Timeout are its schedule's defaults (zero: 1 s and 800 ms).
	Interval, Timeout time.Duration
	// Judged is the hub's default of how long it must fail before its machine is Unhealthy; zero:
	// reported and shown, but never judged (a clock offset or a filling disk is not healed by a reboot).
	Judged time.Duration
	// Section returns its config section with its own defaults (a pointer).
	Section func() ProbeSection
	// OptIn: it runs only where its section says enabled: true (a probe that needs a file a host may
	// not have).
	OptIn bool
}

// ProbeSection is a probe's section of the agent's config: the settings every probe has (embedded)
// and its own fields.
type ProbeSection interface {
	// Common is the settings every probe has.
	Common() *ProbeSettings
	// New makes the probe (nil, nil: nothing to run on this node, as the etcd probe without a member).
	New(env ProbeEnv) (Probe, error)
}

// ProbeSettings are what every probe's section has.
type ProbeSettings struct {
	// Enabled defaults to true on an agent (false for an opt-in probe) and false on a witness (which
	// runs no probes).
	Enabled *bool `json:"enabled,omitempty"`
	// Interval is how often the probe runs (default 1 s, or the probe's own).
	Interval config.Duration `json:"interval"`
	// Timeout is how long one run may take before it fails (default 800 ms, at most the interval).
	Timeout config.Duration `json:"timeout"`
	// FailureThreshold is how many runs in a row must fail before the probe is reported failing
	// (default 2: one slow answer on a busy machine is no failure); the failure is then counted from
	// the first of them, so the hub's probeTimeouts are kept to the same clock.
	FailureThreshold int `json:"failureThreshold"`
}

// Common returns s: a section that embeds ProbeSettings has it.
func (s *ProbeSettings) Common() *ProbeSettings { return s }

// ProbeEnv is what a probe may need of the agent that runs it.
type ProbeEnv struct {
	// Etcd is the agent's own etcd member, or nil (a witness, or etcd's probe disabled).
	Etcd *Etcd
	// Clock gives peers' clock offsets (the gossip).
	Clock ClockSource
}

// PathsSection is a section with file paths: they are relative to the config file that names them.
type PathsSection interface {
	Paths() []*string
}

// ValidatedSection is a section with fields of its own to check: the error names the field without
// the probes.NAME prefix.
type ValidatedSection interface {
	Validate() error
}

// probeKinds is filled by the probes' init functions only, and read after.
var probeKinds []ProbeKind

// RegisterProbe registers a kind of probe; it is called from the init of the probe's own file.
func RegisterProbe(k ProbeKind) {
	if k.Name == "" || k.Section == nil || slices.ContainsFunc(probeKinds, func(o ProbeKind) bool { return o.Name == k.Name }) {
		panic(fmt.Sprintf("health.RegisterProbe: a probe without a name or section, or %q registered twice", k.Name))
	}
	probeKinds = append(probeKinds, k)
	slices.SortFunc(probeKinds, func(a, b ProbeKind) int { return strings.Compare(a.Name, b.Name) })
}

// ProbeKinds are the registered kinds of probe, by name.
func ProbeKinds() []ProbeKind { return slices.Clone(probeKinds) }

// LookupProbe finds a kind of probe by name; the error lists the known ones.
func LookupProbe(name string) (ProbeKind, error) {
	for _, k := range probeKinds {
		if k.Name == name {
			return k, nil
		}
	}
	return ProbeKind{}, fmt.Errorf("no probe named %q (known: %s)", name, strings.Join(ProbeNames(), ", "))
}

// ProbeNames are the registered probes' names.
func ProbeNames() []string {
	var out []string
	for _, k := range probeKinds {
		out = append(out, k.Name)
	}
	return out
}

// Defaults fills what s leaves empty with its kind's schedule; enabled is the default of Enabled
// (an opt-in kind's is false).
func (k ProbeKind) Defaults(s ProbeSection, enabled bool) {
	enabled = enabled && !k.OptIn
	c := s.Common()
	if c.Enabled == nil {
		c.Enabled = &enabled
	}
	if c.Interval.Duration == 0 {
		c.Interval.Duration = cmp.Or(k.Interval, time.Second)
	}
	if c.Timeout.Duration == 0 {
		c.Timeout.Duration = min(cmp.Or(k.Timeout, 800*time.Millisecond), c.Interval.Duration)
	}
	if c.FailureThreshold == 0 {
		c.FailureThreshold = DefaultFailureThreshold
	}
}
