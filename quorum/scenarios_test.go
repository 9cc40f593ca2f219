package quorum

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cluster builds a cluster from a compact description: one letter per member, in order etcd-1, etcd-2,
// …: H healthy voter, D dead (unhealthy) voter, U unknown voter, F fenced voter, I voter with a
// remediation in flight, L healthy learner, l learner still catching up.
func cluster(desc string) Cluster {
	var c Cluster
	for i, r := range desc {
		m := Member{Name: fmt.Sprintf("etcd-%d", i+1)}
		switch r {
		case 'H':
			m.Health = Healthy
		case 'D':
			m.Health = Unhealthy
		case 'U':
			m.Health = HealthUnknown
		case 'F':
			m.Health, m.Disruption = Unhealthy, Fenced
		case 'I':
			m.Health, m.Disruption = Healthy, InFlight
		case 'L':
			m.Learner, m.Health = true, Healthy
		case 'l':
			m.Learner, m.Health = true, Unhealthy
		default:
			panic("unknown member letter " + string(r))
		}
		c.Members = append(c.Members, m)
	}
	return c
}

func steps(ss ...string) []Step {
	out := make([]Step, len(ss))
	for i, s := range ss {
		var op, member string
		_, _ = fmt.Sscan(s, &op, &member)
		for o := OpPowerCycle; o <= OpRemove; o++ {
			if o.String() == op {
				out[i] = Step{o, member}
			}
		}
	}
	return out
}

// The scenarios of etcd's FAQ and runtime-reconfiguration guide, one row each.
func TestScenarios(t *testing.T) {
	learnerFirst := ReplaceOptions{NewMember: "etcd-new"}
	voterUpOnly := ReplaceOptions{NewMember: "etcd-new", Orders: []Order{ScaleUpFirst}, Join: JoinAsVoter}
	voterAny := ReplaceOptions{NewMember: "etcd-new", Join: JoinAsVoter}
	downOnly := ReplaceOptions{NewMember: "etcd-new", Orders: []Order{ScaleDownFirst}}
	tests := []struct {
		name      string
		cluster   string
		policy    Policy
		strategy  Strategy
		member    string
		opts      ReplaceOptions
		wantSteps []Step
		wantCost  int
		violation Violation // for a single refusal
		wantErr   []string  // substrings of the refusal message
	}{
		{name: "1 dead of 3: reboot the dead one is free", cluster: "HHD", strategy: Reboot, member: "etcd-3",
			wantSteps: steps("power-cycle etcd-3", "await-healthy etcd-3")},
		{name: "1 dead of 3: reboot a healthy one is refused", cluster: "HHD", strategy: Reboot, member: "etcd-2",
			violation: BelowQuorum, wantErr: []string{"rebooting etcd-2 leaves 1 of 3 voters healthy; quorum needs 2"}},
		{name: "3 healthy: reboot one costs one", cluster: "HHH", strategy: Reboot, member: "etcd-1",
			wantSteps: steps("power-cycle etcd-1", "await-healthy etcd-1"), wantCost: 1},
		{name: "1 dead of 3: replace it, learner first", cluster: "HHD", strategy: Replace, member: "etcd-3", opts: learnerFirst,
			wantSteps: steps("add-learner etcd-new", "await-healthy etcd-new", "promote etcd-new", "remove etcd-3")},
		{name: "2 dead of 5: reboot a dead one is free", cluster: "HHHDD", strategy: Reboot, member: "etcd-5",
			wantSteps: steps("power-cycle etcd-5", "await-healthy etcd-5")},
		{name: "2 dead of 5: reboot a healthy one is refused", cluster: "HHHDD", strategy: Reboot, member: "etcd-1",
			violation: BelowQuorum, wantErr: []string{"rebooting etcd-1 leaves 2 of 5 voters healthy; quorum needs 3"}},
		{name: "2 dead of 5: a new voter first would need 4 of 6, so remove first", cluster: "HHHDD", strategy: Replace, member: "etcd-4", opts: voterAny,
			wantSteps: steps("remove etcd-4", "add-voter etcd-new", "await-healthy etcd-new")},
		{name: "2 dead of 5: a learner first is safe", cluster: "HHHDD", strategy: Replace, member: "etcd-4", opts: learnerFirst,
			wantSteps: steps("add-learner etcd-new", "await-healthy etcd-new", "promote etcd-new", "remove etcd-4")},
		{name: "a learner already present: no second learner", cluster: "HHHl", strategy: Replace, member: "etcd-1", opts: learnerFirst,
			wantErr: []string{"no safe way to replace etcd-1 now",
				"scale-up-first (new member joins as learner): adding learner etcd-new: etcd already has 1 learner(s), max 1",
				"scale-down-first (new member joins as learner): adding learner etcd-new: etcd already has 1 learner(s), max 1"}},
		{name: "a learner already present: a voter may join", cluster: "HHHl", strategy: Replace, member: "etcd-1", opts: voterAny,
			wantSteps: steps("add-voter etcd-new", "await-healthy etcd-new", "remove etcd-1"), wantCost: 1},
		{name: "a learner is never counted", cluster: "HDL", strategy: Reboot, member: "etcd-1",
			violation: BelowQuorum, wantErr: []string{"rebooting etcd-1 leaves 0 of 2 voters healthy; quorum needs 2"}},
		{name: "quorum lost: no membership change", cluster: "HDD", strategy: Replace, member: "etcd-2", opts: learnerFirst,
			wantErr: []string{"adding learner etcd-new changes membership, but etcd has lost quorum (1 of 3 voters healthy, quorum needs 2)",
				"power-cycling the dead members is the only way out"}},
		{name: "quorum lost: power-cycling a dead member is the way out", cluster: "HDD", strategy: Reboot, member: "etcd-3",
			wantSteps: steps("power-cycle etcd-3", "await-healthy etcd-3")},
		{name: "quorum lost: the last healthy one is not touched", cluster: "HDD", strategy: Reboot, member: "etcd-1",
			violation: BelowQuorum, wantErr: []string{"rebooting etcd-1 leaves 0 of 3 voters healthy; quorum needs 2"}},
		{name: "scale up first with a dead voter: a new voter is refused", cluster: "HHD", strategy: Replace, member: "etcd-3", opts: voterUpOnly,
			wantErr: []string{"adding voter etcd-new leaves 2 of 4 voters healthy; quorum needs 3"}},
		{name: "scale up first with a dead voter: a learner is allowed", cluster: "HHD", strategy: Replace, member: "etcd-3",
			opts:      ReplaceOptions{NewMember: "etcd-new", Orders: []Order{ScaleUpFirst}},
			wantSteps: steps("add-learner etcd-new", "await-healthy etcd-new", "promote etcd-new", "remove etcd-3")},
		{name: "scale up first with the old one a healthy voter", cluster: "HHH", strategy: Replace, member: "etcd-3", opts: voterUpOnly,
			wantSteps: steps("add-voter etcd-new", "await-healthy etcd-new", "remove etcd-3"), wantCost: 1},
		{name: "the last voter is never removed", cluster: "H", strategy: Replace, member: "etcd-1", opts: downOnly,
			wantErr: []string{"removing etcd-1 would remove the last voter"}},
		{name: "a single voter can still be replaced learner first", cluster: "H", strategy: Replace, member: "etcd-1", opts: learnerFirst,
			wantSteps: steps("add-learner etcd-new", "await-healthy etcd-new", "promote etcd-new", "remove etcd-1")},
		{name: "a member of unknown health is fenced as if it were up: it costs one", cluster: "HHU", strategy: Fence, member: "etcd-3",
			wantSteps: steps("power-off etcd-3"), wantCost: 1},
		{name: "a member of unknown health is not rebooted while quorum holds by its vote", cluster: "HDU", strategy: Reboot, member: "etcd-3",
			violation: BelowQuorum, wantErr: []string{"rebooting etcd-3 leaves 1 of 3 voters healthy; quorum needs 2 (etcd-3's health is unknown: nothing shows it down, so the step is judged as if it were up)"}},
		{name: "nor when the count is already below quorum without it", cluster: "DDU", strategy: Reboot, member: "etcd-3",
			violation: BelowQuorum, wantErr: []string{"rebooting etcd-3 leaves 0 of 3 voters healthy; quorum needs 2"}},
		{name: "an unknown member that is not the target is not counted", cluster: "HUH", strategy: Reboot, member: "etcd-1",
			violation: BelowQuorum, wantErr: []string{"rebooting etcd-1 leaves 1 of 3 voters healthy; quorum needs 2"}},
		{name: "fencing a healthy voter costs one", cluster: "HHH", strategy: Fence, member: "etcd-2",
			wantSteps: steps("power-off etcd-2"), wantCost: 1},
		{name: "in-flight work counts as disrupted", cluster: "HHI", strategy: Reboot, member: "etcd-1",
			violation: BelowQuorum, wantErr: []string{"rebooting etcd-1 leaves 1 of 3 voters healthy; quorum needs 2"}},
		{name: "no second remediation of one member", cluster: "HHI", strategy: Reboot, member: "etcd-3",
			violation: AlreadyInFlight, wantErr: []string{"etcd-3 already has a remediation in flight"}},
		{name: "minFaultTolerance keeps headroom", cluster: "HHHHH", policy: Policy{MinFaultTolerance: 2, MaxLearners: 1}, strategy: Reboot, member: "etcd-1",
			violation: BelowFaultTolerance, wantErr: []string{"rebooting etcd-1 leaves 4 of 5 voters healthy, tolerating 1 failure(s); policy minFaultTolerance needs 2"}},
		{name: "minFaultTolerance never blocks rebooting a dead member", cluster: "HHHDD", policy: Policy{MinFaultTolerance: 2, MaxLearners: 1}, strategy: Reboot, member: "etcd-4",
			wantSteps: steps("power-cycle etcd-4", "await-healthy etcd-4")},
		{name: "replacing a learner is refused", cluster: "HHHl", strategy: Replace, member: "etcd-4", opts: learnerFirst,
			wantErr: []string{"etcd-4 is a learner"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.policy
			if p == (Policy{}) {
				p = DefaultPolicy()
			}
			plan, err := cluster(tt.cluster).PlanFor(p, tt.strategy, tt.member, tt.opts)
			if tt.wantErr != nil {
				require.Error(t, err, "planned %v", plan)
				for _, want := range tt.wantErr {
					assert.Contains(t, err.Error(), want)
				}
				if tt.violation != 0 {
					var r *Refusal
					require.ErrorAs(t, err, &r)
					assert.Equal(t, tt.violation, r.Violation)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantSteps, plan.Steps)
			assert.Equal(t, tt.wantCost, plan.Cost)
			assert.Equal(t, tt.strategy, plan.Strategy)
		})
	}
}

func TestCheckRefusesPromotingAnUnsyncedLearner(t *testing.T) {
	_, err := cluster("HHHl").Check(DefaultPolicy(), Step{OpPromote, "etcd-4"})
	var r *Refusal
	require.ErrorAs(t, err, &r)
	assert.Equal(t, LearnerNotReady, r.Violation)
	assert.EqualError(t, err, "promoting etcd-4: the learner is not healthy and in sync yet, and etcd refuses to promote it")

	next, err := cluster("HHHL").Check(DefaultPolicy(), Step{OpPromote, "etcd-4"})
	require.NoError(t, err)
	assert.Equal(t, 4, next.Budget(DefaultPolicy()).HealthyVoters)
}

func TestStructuralErrorsNameTheMember(t *testing.T) {
	c := cluster("HHH")
	tests := []struct {
		name string
		do   func() error
		want string
	}{
		{"unknown member", func() error { _, err := c.PlanReboot(DefaultPolicy(), "etcd-9"); return err },
			`no etcd member named "etcd-9" in the membership (3 members)`},
		{"new member without a name", func() error { _, err := c.PlanReplace(DefaultPolicy(), "etcd-1", ReplaceOptions{}); return err },
			`replacing etcd-1: the new member needs a name of its own (got "")`},
		{"add an existing member", func() error { _, err := c.Apply(Step{OpAddVoter, "etcd-2"}); return err },
			"adding voter etcd-2: member etcd-2 already exists"},
		{"unknown strategy", func() error {
			_, err := c.PlanFor(DefaultPolicy(), Strategy(9), "etcd-1", ReplaceOptions{})
			return err
		},
			"planning etcd-1: unknown strategy Strategy(9)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do()
			require.EqualError(t, err, tt.want)
			var r *Refusal
			assert.False(t, errors.As(err, &r), "a structural error is not a quorum refusal")
		})
	}
}

func TestBudget(t *testing.T) {
	tests := []struct {
		cluster string
		minFT   int
		want    Budget
		text    string
	}{
		{"HHH", 0, Budget{Voters: 3, HealthyVoters: 3, Quorum: 2, FaultTolerance: 1, Available: 1}, "3 of 3 voters healthy, quorum 2, tolerates 1, budget 1"},
		{"HHHHH", 1, Budget{Voters: 5, HealthyVoters: 5, Quorum: 3, FaultTolerance: 2, Available: 1}, "5 of 5 voters healthy, quorum 3, tolerates 2, budget 1"},
		{"HHDL", 0, Budget{Voters: 3, Learners: 1, HealthyVoters: 2, Quorum: 2, FaultTolerance: 0, Available: 0}, "2 of 3 voters healthy, quorum 2, tolerates 0, budget 0"},
		{"HDD", 0, Budget{Voters: 3, HealthyVoters: 1, Quorum: 2, FaultTolerance: -1, Available: 0}, "quorum lost: 1 of 3 voters healthy, quorum needs 2"},
		{"HHHI", 0, Budget{Voters: 4, HealthyVoters: 3, Quorum: 3, FaultTolerance: 0, Available: 0}, "3 of 4 voters healthy, quorum 3, tolerates 0, budget 0"},
	}
	for _, tt := range tests {
		t.Run(tt.cluster, func(t *testing.T) {
			b := cluster(tt.cluster).Budget(Policy{MinFaultTolerance: tt.minFT})
			assert.Equal(t, tt.want, b)
			assert.Equal(t, tt.text, b.String())
		})
	}
}

func TestParseLimit(t *testing.T) {
	tests := []struct {
		in      string
		want    Limit
		of10    int
		wantErr string
	}{
		{in: "3", want: Count(3), of10: 3},
		{in: "40%", want: Percent(40), of10: 4},
		{in: " 15% ", want: Percent(15), of10: 1},
		{in: "", want: Limit{}, of10: -1},
		{in: "abc", wantErr: `limit "abc": want a count like "3" or a percentage like "40%"`},
		{in: "-1", wantErr: `limit "-1": must not be negative`},
		{in: "150%", wantErr: `limit "150%": a percentage must be at most 100%`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseLimit(tt.in)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.of10, got.Of(10))
			text, err := got.MarshalText()
			require.NoError(t, err)
			var back Limit
			require.NoError(t, back.UnmarshalText(text))
			assert.Equal(t, got, back)
		})
	}
}

func TestPolicyValidate(t *testing.T) {
	require.NoError(t, DefaultPolicy().Validate())
	require.EqualError(t, Policy{MinFaultTolerance: -1}.Validate(), "minFaultTolerance: -1 is negative; use 0 for etcd's own quorum line")
	require.EqualError(t, Policy{MaxLearners: -2}.Validate(), "maxLearners: -2 is negative; etcd's default is 1")
}

func TestParseStep(t *testing.T) {
	for o := OpPowerCycle; o <= OpRemove; o++ {
		s := Step{o, "etcd-2"}
		text, err := s.MarshalText()
		require.NoError(t, err)
		var back Step
		require.NoError(t, back.UnmarshalText(text))
		require.Equal(t, s, back)
	}
	for _, bad := range []string{"", "reboot etcd-1", "power-cycle", "power-cycle a b"} {
		_, err := ParseStep(bad)
		require.ErrorContains(t, err, "want an operation and a member", "%q", bad)
		require.Panics(t, func() { MustParseSteps("power-cycle etcd-0", bad) }, "%q", bad)
	}
	require.Equal(t, []Step{{OpPowerCycle, "etcd-2"}, {OpAwaitHealthy, "etcd-2"}}, MustParseSteps("power-cycle etcd-2", "await-healthy etcd-2"))
}

func TestPlanBeside(t *testing.T) {
	c := cluster("HHL")
	replace := Machine{Name: "cp-1", Member: "etcd-1", InFlight: true, Strategy: Replace,
		Remaining: []Step{{OpPromote, "etcd-3"}, {OpRemove, "etcd-1"}}}
	_, err := c.PlanBeside(DefaultPolicy(), Machine{Name: "cp-3", Member: "etcd-3", Strategy: Reboot}, []Machine{replace})
	var r *OrderRefusal
	require.ErrorAs(t, err, &r)
	require.Equal(t, "rebooting etcd-3 is unsafe beside the work in flight: in one order of their steps, after promote etcd-3 → "+
		"remove etcd-1 (cp-1's replace), rebooting etcd-3 (cp-3's reboot) leaves 1 of 2 voters healthy; quorum needs 2", err.Error())
	// With nothing in flight the same reboot is free: a learner does not count.
	plan, err := c.PlanBeside(DefaultPolicy(), Machine{Name: "cp-3", Member: "etcd-3", Strategy: Reboot}, nil)
	require.NoError(t, err)
	require.Zero(t, plan.Cost)
}
