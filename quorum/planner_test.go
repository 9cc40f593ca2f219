package quorum

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/seed"
)

var t0 = time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)

func etcdMachine(i int, unhealthy bool, since int, s Strategy) Machine {
	return Machine{Name: fmt.Sprintf("cp-%d", i), Member: fmt.Sprintf("etcd-%d", i), Unhealthy: unhealthy,
		Since: t0.Add(time.Duration(since) * time.Second), Strategy: s}
}

func starts(o Outcome) []string {
	var out []string
	for _, d := range o.Started() {
		out = append(out, d.Machine)
	}
	return out
}

func reasons(o Outcome) map[string]string {
	out := map[string]string{}
	for _, d := range o.Decisions {
		out[d.Machine] = d.Reason
	}
	return out
}

func TestPlanPass(t *testing.T) {
	tests := []struct {
		name       string
		cluster    string
		machines   []Machine
		pools      PoolLimits
		wantStarts []string
		wantReason map[string]string
	}{
		{
			name:    "quorum lost: both dead members are power-cycled at once, longest dead first",
			cluster: "HDD",
			machines: []Machine{etcdMachine(1, false, 0, Reboot), etcdMachine(2, true, 20, Reboot),
				etcdMachine(3, true, 10, Reboot)},
			wantStarts: []string{"cp-3", "cp-2"},
			wantReason: map[string]string{"cp-2": "free: etcd-2 is not a healthy voter"},
		},
		{
			name:    "3 healthy members on 2 sick machines: one reboot, the other waits with the numbers",
			cluster: "HHH",
			machines: []Machine{etcdMachine(1, true, 5, Reboot), etcdMachine(2, true, 5, Reboot),
				etcdMachine(3, false, 0, Reboot)},
			wantStarts: []string{"cp-1"},
			wantReason: map[string]string{"cp-1": "costs 1 of a budget of 1",
				"cp-2": "rebooting etcd-2 leaves 1 of 3 voters healthy; quorum needs 2"},
		},
		{
			// Nobody can say whether etcd-3 is up (its observers went quiet): rebooting it is judged as
			// if it were, so it waits while etcd-2 is down; the dead member's reboot is free.
			name:    "a member of unknown health is rebooted as if it were up",
			cluster: "HDU",
			machines: []Machine{etcdMachine(1, false, 0, Reboot), etcdMachine(2, true, 20, Reboot),
				etcdMachine(3, true, 10, Reboot)},
			wantStarts: []string{"cp-2"},
			wantReason: map[string]string{"cp-3": "rebooting etcd-3 leaves 1 of 3 voters healthy; quorum needs 2 " +
				"(etcd-3's health is unknown: nothing shows it down, so the step is judged as if it were up)"},
		},
		{
			name:       "and costs one of a budget that counts it",
			cluster:    "HHHU",
			machines:   []Machine{etcdMachine(4, true, 10, Reboot)},
			wantStarts: []string{"cp-4"},
			wantReason: map[string]string{"cp-4": "costs 1 if etcd-4 is up (its health is unknown), of a budget of 1 counting it"},
		},
		{
			name:    "5 healthy members tolerate two reboots at once",
			cluster: "HHHHH",
			machines: []Machine{etcdMachine(1, true, 5, Reboot), etcdMachine(2, true, 5, Reboot),
				etcdMachine(3, true, 5, Reboot)},
			wantStarts: []string{"cp-1", "cp-2"},
			wantReason: map[string]string{"cp-3": "rebooting etcd-3 leaves 2 of 5 voters healthy; quorum needs 3"},
		},
		{
			name:    "dead members go before sick machines with a healthy member",
			cluster: "HHHHD",
			machines: []Machine{etcdMachine(1, true, 1, Reboot), etcdMachine(5, true, 100, Reboot),
				{Name: "worker-1", Unhealthy: true, Since: t0, Strategy: Reboot}},
			wantStarts: []string{"cp-5", "cp-1", "worker-1"},
		},
		{
			name:    "a replace in flight: a dead member may still be rebooted, a healthy one waits",
			cluster: "HHHHD",
			machines: []Machine{{Name: "cp-4", Member: "etcd-4", InFlight: true, Strategy: Replace},
				etcdMachine(1, true, 1, Reboot), etcdMachine(5, true, 1, Reboot), etcdMachine(2, true, 1, Replace)},
			wantStarts: []string{"cp-5"},
			wantReason: map[string]string{
				"cp-4": "replace in flight",
				"cp-1": "rebooting etcd-1: an etcd membership change is in flight; other membership changes and disruptions of healthy voters wait until it is done",
				"cp-2": "removing etcd-2: an etcd membership change is in flight; other membership changes and disruptions of healthy voters wait until it is done"},
		},
		{
			// Found from outside: the learner a replace in flight is about to promote looked free to
			// fence; promote → power-off etcd-3 → remove etcd-1 leaves 1 of 2 voters healthy.
			name:    "a replace in flight about to promote its learner: fencing the learner waits",
			cluster: "HHL",
			machines: []Machine{
				{Name: "cp-1", Member: "etcd-1", Unhealthy: true, InFlight: true, Strategy: Replace,
					Replace: ReplaceOptions{NewMember: "etcd-3", Orders: []Order{ScaleUpFirst}}},
				{Name: "cp-3", Member: "etcd-3", Unhealthy: true, Strategy: Fence}},
			wantReason: map[string]string{"cp-3": "fencing etcd-3 is unsafe beside the work in flight: in one order of their steps, " +
				"after await-healthy etcd-3 → promote etcd-3 → remove etcd-1 (cp-1's replace), fencing etcd-3 (cp-3's fence) leaves 1 of 2 voters healthy; quorum needs 2"},
		},
		{
			name:    "a reboot in flight on a dead member: a second dead member's reboot is free in every order",
			cluster: "HDD",
			machines: []Machine{{Name: "cp-2", Member: "etcd-2", InFlight: true, Strategy: Reboot, Remaining: []Step{{OpAwaitHealthy, "etcd-2"}}},
				etcdMachine(3, true, 1, Reboot)},
			wantStarts: []string{"cp-3"},
		},
		{
			name:    "two replaces: one at a time",
			cluster: "HHHHH",
			machines: []Machine{
				{Name: "cp-1", Member: "etcd-1", Unhealthy: true, Since: t0, Strategy: Replace, Replace: ReplaceOptions{NewMember: "etcd-6"}},
				{Name: "cp-2", Member: "etcd-2", Unhealthy: true, Since: t0, Strategy: Replace, Replace: ReplaceOptions{NewMember: "etcd-7"}}},
			wantStarts: []string{"cp-1"},
		},
		{
			name:       "a member the agents do not agree on waits",
			cluster:    "HHH",
			machines:   []Machine{{Name: "cp-9", Member: "etcd-9", Unhealthy: true, Strategy: Reboot}},
			wantReason: map[string]string{"cp-9": "etcd member etcd-9 is not in the membership the agents agree on; waiting for a consistent view"},
		},
		{
			name:    "pool over maxUnhealthy is held whole",
			cluster: "HHH",
			pools:   PoolLimits{MaxUnhealthy: Percent(40)},
			machines: []Machine{{Name: "w1", Unhealthy: true, Strategy: Reboot}, {Name: "w2", Unhealthy: true, Strategy: Reboot},
				{Name: "w3"}, {Name: "w4"}},
			wantReason: map[string]string{"w1": "pool default: 2 of 4 machines are unhealthy, more than maxUnhealthy 40% (1): remediation is held for the whole pool until fewer are unhealthy"},
		},
		{
			name:    "maxInFlight as a percentage allows at least one",
			cluster: "HHH",
			pools:   PoolLimits{MaxInFlight: Percent(10)},
			machines: []Machine{{Name: "w1", Pool: "gpu", Unhealthy: true, Strategy: Reboot}, {Name: "w2", Pool: "gpu", Unhealthy: true, Strategy: Reboot},
				{Name: "w3", Pool: "gpu"}},
			wantStarts: []string{"w1"},
			wantReason: map[string]string{"w2": "pool gpu: 1 remediation(s) in flight, maxInFlight 10% of 3 machines allows 1"},
		},
		{
			name:    "maxInFlight counts work already in flight, per pool",
			cluster: "HHH",
			pools:   PoolLimits{MaxInFlight: Count(1)},
			machines: []Machine{{Name: "a1", Pool: "a", InFlight: true, Strategy: Reboot}, {Name: "a2", Pool: "a", Unhealthy: true, Strategy: Reboot},
				{Name: "b1", Pool: "b", Unhealthy: true, Strategy: Fence}},
			wantStarts: []string{"b1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DefaultPolicy()
			p.Pools = tt.pools
			in := Input{Cluster: cluster(tt.cluster), Machines: tt.machines, Policy: p}
			out, err := PlanPass(in)
			require.NoError(t, err)
			assert.Equal(t, tt.wantStarts, starts(out))
			got := reasons(out)
			for m, want := range tt.wantReason {
				assert.Equal(t, want, got[m], "reason for %s", m)
			}
			assert.Empty(t, checkPass(in, out))
		})
	}
}

func TestPlanPassIsDeterministic(t *testing.T) {
	var ms []Machine
	for i := 1; i <= 5; i++ {
		ms = append(ms, etcdMachine(i, i%2 == 1, 7, Reboot))
	}
	for i := range 20 {
		ms = append(ms, Machine{Name: fmt.Sprintf("w%02d", i), Unhealthy: i%3 == 0, Since: t0, Strategy: Reboot})
	}
	in := Input{Cluster: cluster("HHHHH"), Machines: ms, Policy: DefaultPolicy()}
	want, err := PlanPass(in)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		shuffled := slices.Clone(ms)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		got, err := PlanPass(Input{Cluster: in.Cluster, Machines: shuffled, Policy: in.Policy})
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
}

func TestPlanPassRejectsBadInput(t *testing.T) {
	tests := []struct {
		name     string
		machines []Machine
		policy   Policy
		want     string
	}{
		{"duplicate machine", []Machine{{Name: "a"}, {Name: "a"}}, DefaultPolicy(), `machine "a" is listed twice`},
		{"nameless machine", []Machine{{Name: "a"}, {}}, DefaultPolicy(), "machine #1 has no name"},
		{"two claims on one member", []Machine{{Name: "a", Member: "etcd-1"}, {Name: "b", Member: "etcd-1"}}, DefaultPolicy(),
			`machines "a" and "b" both claim etcd member "etcd-1"`},
		{"unknown strategy", []Machine{{Name: "a", Unhealthy: true}}, DefaultPolicy(), `machine "a": unknown strategy Strategy(0)`},
		{"bad policy", nil, Policy{MinFaultTolerance: -1}, "policy: minFaultTolerance: -1 is negative; use 0 for etcd's own quorum line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PlanPass(Input{Cluster: cluster("HHH"), Machines: tt.machines, Policy: tt.policy})
			require.EqualError(t, err, tt.want)
		})
	}
}

// TestPlanPassRandomized checks the pass-level invariant (see checkPass) on seeded random inputs. A
// failure prints its seed; replay it with HALE_SEED.
func TestPlanPassRandomized(t *testing.T) {
	const runs = 20000
	seed := seed.FromEnv(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	started := 0
	for i := range runs {
		in := randomInput(rng)
		out, err := PlanPass(in)
		require.NoError(t, err, "run %d (seed %d)", i, seed)
		if msg := checkPass(in, out); msg != "" {
			t.Fatalf("run %d (seed %d): %s\ninput: %+v\noutcome: %+v", i, seed, msg, in, out)
		}
		if msg := checkPassOrders(in, out, &passCounts{}); msg != "" {
			t.Fatalf("run %d (seed %d): %s\ninput: %+v\noutcome: %+v", i, seed, msg, in, out)
		}
		started += len(out.Started())
	}
	t.Logf("%d random passes (seed %d), %d remediations started, all within the invariant", runs, seed, started)
	require.Positive(t, started)
}

// intner is what randomInput draws from: a seeded *rand.Rand, or a fuzzer's bytes.
type intner interface{ IntN(n int) int }

// randomInput draws a cluster of 1..7 voters and 0..1 learner, one machine per member and up to 12
// machines in two pools, with random verdicts, strategies, work in flight and policy.
func randomInput(rng intner) Input {
	var c Cluster
	voters := 1 + rng.IntN(7)
	for i := range voters + rng.IntN(2) {
		c.Members = append(c.Members, Member{Name: fmt.Sprintf("etcd-%d", i), Learner: i >= voters,
			Health: Health(rng.IntN(3)), Disruption: Disruption(rng.IntN(3))})
	}
	var ms []Machine
	inFlightReplace := false
	for i, m := range c.Members {
		mc := Machine{Name: fmt.Sprintf("cp-%d", i), Member: m.Name, Unhealthy: rng.IntN(2) == 0,
			Since: t0.Add(time.Duration(rng.IntN(4)) * time.Second), Strategy: Strategy(1 + rng.IntN(3)),
			Replace: ReplaceOptions{NewMember: fmt.Sprintf("new-%d", i), Join: Join(1 + rng.IntN(2))}}
		if m.Disruption == InFlight && (mc.Strategy != Replace || !inFlightReplace) {
			mc.InFlight = true
			inFlightReplace = inFlightReplace || mc.Strategy == Replace
		}
		if rng.IntN(6) == 0 {
			mc.Held = "detached"
		}
		ms = append(ms, mc)
	}
	for i := range rng.IntN(13) {
		ms = append(ms, Machine{Name: fmt.Sprintf("w-%d", i), Pool: []string{"", "gpu"}[rng.IntN(2)],
			Unhealthy: rng.IntN(3) == 0, InFlight: rng.IntN(8) == 0, Strategy: Strategy(1 + rng.IntN(3)),
			Held: []string{"", "", "", "cooling down"}[rng.IntN(4)]})
	}
	limits := []Limit{{}, Count(0), Count(1), Count(3), Percent(10), Percent(50)}
	return Input{Cluster: c, Machines: ms, Policy: Policy{
		MinFaultTolerance: rng.IntN(3), MaxLearners: rng.IntN(2),
		Pools: PoolLimits{MaxInFlight: limits[rng.IntN(len(limits))], MaxUnhealthy: limits[rng.IntN(len(limits))]},
	}}
}

// checkPass asserts, with the reference of model_test.go, that everything a pass starts is safe
// together with everything already in flight: the worst moment (every started member down at once)
// keeps healthy voters ≥ quorum if they were before, and the policy's headroom; membership changes go
// one at a time and the one started is safe at every step from that worst moment; pools stay within
// their caps; every candidate gets one decision, in priority order.
//
// A replace's old member is not counted as down: it stays a voter until its plan removes it, and its
// plan is walked step by step instead.
func checkPass(in Input, out Outcome) string {
	observed := toRef(in.Cluster)
	byMember := map[string]Machine{}
	for _, m := range in.Machines {
		if m.Member != "" {
			byMember[m.Member] = m
		}
	}
	changes := 0
	for _, m := range in.Machines {
		if i := refFind(observed, m.Member); m.Member != "" && i >= 0 && m.InFlight {
			if m.Strategy == Replace {
				changes++ // its old member stays a voter until its plan removes it
			} else if observed.m[i].disruption == NotDisrupted {
				observed.m[i].disruption = InFlight
			}
		}
	}
	held := map[string]string{}
	for _, m := range in.Machines {
		if m.Held != "" && !m.InFlight {
			held[m.Name] = m.Held
		}
	}
	worst := observed
	var replace *Decision
	for i, d := range out.Decisions {
		if why, ok := held[d.Machine]; ok && (d.Start || d.Reason != why) {
			return fmt.Sprintf("%s is held (%s) yet decided %+v", d.Machine, why, d)
		}
		if !d.Start || d.Member == "" {
			continue
		}
		j := refFind(worst, d.Member)
		if j < 0 {
			return fmt.Sprintf("started %s on %s, which is not a member", d.Strategy, d.Member)
		}
		if d.Strategy == Replace {
			changes++
			replace = &out.Decisions[i]
		} else {
			worst.m[j].disruption = InFlight
		}
	}
	if changes > 1 {
		return fmt.Sprintf("%d membership changes at once", changes)
	}
	before, after := refFaultTolerance(observed), refFaultTolerance(worst)
	if before >= 0 && after < 0 {
		return fmt.Sprintf("started work leaves fault tolerance %d (was %d)", after, before)
	}
	if after < before && after < in.Policy.MinFaultTolerance {
		return fmt.Sprintf("started work leaves fault tolerance %d, below minFaultTolerance %d", after, in.Policy.MinFaultTolerance)
	}
	if replace != nil {
		if ok, _ := refWalk(worst, replace.Plan.Steps, in.Policy); !ok {
			return fmt.Sprintf("replace plan %v is unsafe from %v", replace.Plan, worst)
		}
	}

	// Pools.
	type tally struct{ total, unhealthy, inFlight, started int }
	pools := map[string]*tally{}
	for _, m := range in.Machines {
		if m.Member != "" {
			continue
		}
		p := pools[m.pool()]
		if p == nil {
			p = &tally{}
			pools[m.pool()] = p
		}
		p.total++
		if m.Unhealthy || m.InFlight {
			p.unhealthy++
		}
		if m.InFlight {
			p.inFlight++
		}
	}
	for _, d := range out.Decisions {
		if d.Start && d.Member == "" {
			pools[d.Pool].started++
		}
	}
	for name, p := range pools {
		limits := in.Policy.Pools
		if maxU := limits.MaxUnhealthy.Of(p.total); maxU >= 0 && p.unhealthy > maxU && p.started > 0 {
			return fmt.Sprintf("pool %s: %d unhealthy over maxUnhealthy %d, yet %d started", name, p.unhealthy, maxU, p.started)
		}
		if maxF := maxInFlight(limits.MaxInFlight, p.total); maxF >= 0 && p.started > 0 && p.inFlight+p.started > maxF {
			return fmt.Sprintf("pool %s: %d in flight + %d started over maxInFlight %d", name, p.inFlight, p.started, maxF)
		}
	}

	// One decision per candidate, in-flight first, then in priority order.
	want := 0
	for _, m := range in.Machines {
		if m.InFlight || m.Unhealthy {
			want++
		}
	}
	if len(out.Decisions) != want {
		return fmt.Sprintf("%d decisions for %d candidates", len(out.Decisions), want)
	}
	lastRank := -1
	for _, d := range out.Decisions {
		if d.InFlight {
			if lastRank >= 0 {
				return "an in-flight decision after a candidate"
			}
			continue
		}
		rank := 2
		if d.Member != "" {
			rank = 1
			if i := refFind(observed, d.Member); i < 0 || !(observed.m[i].health == Healthy && observed.m[i].disruption == NotDisrupted && !observed.m[i].learner) {
				rank = 0
			}
		}
		if rank < lastRank {
			return fmt.Sprintf("%s (rank %d) considered after rank %d", d.Machine, rank, lastRank)
		}
		lastRank = rank
	}
	return ""
}

func toRef(c Cluster) refCluster {
	var rc refCluster
	for _, m := range c.Members {
		rc.m[rc.n] = refMember{name: m.Name, learner: m.Learner, health: m.Health, disruption: m.Disruption}
		rc.n++
	}
	return rc
}
