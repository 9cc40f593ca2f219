package hub

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/health"
)

func TestPlanRecovery(t *testing.T) {
	now := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	inv := Inventory{Policy: testPolicy()}
	for i := range 5 {
		n := string(rune('0' + i))
		ep, err := bmc.ParseEndpoint("redfish+http://10.0.0." + n + "/redfish/v1/Systems/1")
		require.NoError(t, err)
		inv.Machines = append(inv.Machines, Machine{MachineRef: MachineRef{Name: "cp-" + n, Node: "cp-" + n, Member: "etcd-" + n}, Endpoint: ep})
	}
	// 5 members, 3 lost for good (cp-1: BMC silent, cp-2 and cp-3: power Off); cp-0 and cp-4 answer,
	// cp-4 further ahead.
	loss := &QuorumLoss{Voters: 5, HealthyVoters: 2, Quorum: 3, ForGood: true, Lost: []LostVoter{
		{Member: "etcd-1", Machine: "cp-1", Evidence: "its BMC: Unreachable at 02:59:00Z", BMCProblem: bmc.ProblemUnreachable, ForGood: true},
		{Member: "etcd-2", Machine: "cp-2", Evidence: "its BMC read the power Off at 02:59:00Z", ForGood: true},
		{Member: "etcd-3", Machine: "cp-3", Evidence: "its BMC read the power Off at 02:59:00Z", ForGood: true}}}
	report := func(node string, index uint64, cluster string) health.Report {
		return health.Report{Node: node, SentAt: now.Add(-time.Second),
			Etcd: &health.EtcdView{ClusterID: cluster, LocalName: "etcd-" + strings.TrimPrefix(node, "cp-"), RaftTerm: 7, RaftIndex: index, ObservedAt: now.Add(-time.Second)}}
	}
	obs := func(rs ...health.Report) Observations {
		o := Observations{Now: now, Reports: map[string]health.Report{}, HubPeers: map[string]health.PeerView{}}
		for _, r := range rs {
			o.Reports[r.Node] = r
			o.HubPeers[r.Node] = health.PeerView{Name: r.Node, State: health.PeerAlive}
		}
		return o
	}
	mark := &RaftMark{ClusterID: "c1", Term: 7, Index: 90_000, Member: "etcd-2", At: now.Add(-time.Minute)}
	answering := obs(report("cp-0", 80_000, "c1"), report("cp-4", 90_100, "c1"),
		report("cp-1", 95_000, "c1")) // a lost member's stale report never makes it a survivor
	for _, tc := range []struct {
		name      string
		st        Status
		obs       Observations
		survivor  string
		atRisk    uint64
		bump      uint64
		blockedBy []string
	}{
		{name: "quorum held", st: Status{}, obs: answering, survivor: "etcd-1", bump: bumpWithoutMark, blockedBy: []string{"quorum is not lost"}},
		{name: "the hub does not plan", st: Status{NotPlanning: "hears 2 of 4 expected observers"}, obs: answering, survivor: "etcd-1", bump: bumpWithoutMark,
			blockedBy: []string{"the hub does not plan (hears 2 of 4 expected observers)"}},
		{name: "lost for good: the survivor furthest ahead, not the first listed", st: Status{QuorumLoss: loss, RaftMark: mark}, obs: answering,
			survivor: "etcd-4", bump: 90_100 / 5},
		{name: "every survivor behind the mark", st: Status{QuorumLoss: loss, RaftMark: mark}, obs: obs(report("cp-0", 80_000, "c1")),
			survivor: "etcd-0", atRisk: 10_000, bump: 10_000 + 90_000/5, blockedBy: []string{"etcd-0 is at raft index 80000, 10000 entries behind the journaled mark 90000"}},
		{name: "a mark of another cluster says nothing", st: Status{QuorumLoss: loss, RaftMark: &RaftMark{ClusterID: "old", Index: 1 << 40}}, obs: answering,
			survivor: "etcd-4", bump: bumpWithoutMark},
		{name: "no survivor", st: Status{QuorumLoss: loss, RaftMark: mark}, obs: obs(), bump: bumpWithoutMark, blockedBy: []string{"no member answers"}},
		{name: "the far side: a lost member's BMC reads it on", obs: answering, survivor: "etcd-4", bump: 90_100 / 5,
			st: Status{RaftMark: mark, QuorumLoss: &QuorumLoss{Voters: 3, HealthyVoters: 1, Quorum: 2, Lost: []LostVoter{
				{Member: "etcd-1", Machine: "cp-1", Evidence: "maxAttempts power-cycles did not bring it back", PoweredOn: true},
				{Member: "etcd-2", Machine: "cp-2"}}}},
			blockedBy: []string{"cp-1 (etcd-1): its BMC reads the host powered on; it may be serving on the far side of a partition",
				"cp-2 (etcd-2): nothing says it will not come back (no evidence)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.st.Time = now
			p := PlanRecovery(tc.st, inv, tc.obs)
			if tc.survivor == "" {
				assert.Nil(t, p.Survivor)
			} else if assert.NotNil(t, p.Survivor) {
				assert.Equal(t, tc.survivor, p.Survivor.Member)
			}
			assert.Equal(t, tc.atRisk, p.DataAtRisk)
			assert.Equal(t, max(tc.bump, minBump), p.BumpRevision, p.BumpWhy)
			require.Len(t, p.Blockers, len(tc.blockedBy), "%q", p.Blockers)
			for i, b := range tc.blockedBy {
				assert.Contains(t, p.Blockers[i], b)
			}
			text := p.String()
			assert.Contains(t, text, "Hale does not carry out a recovery itself yet")
			assert.Equal(t, len(p.Blockers) > 0, strings.Contains(text, "NOT READY"))
		})
	}

	p := PlanRecovery(Status{Time: now, QuorumLoss: loss, RaftMark: mark}, inv, answering)
	assert.Equal(t, []FenceStep{
		{Machine: "cp-1", Member: "etcd-1", How: "its BMC (redfish+http://10.0.0.1:80/systems/1) does not answer: make sure by hand that it is off, and confirm by name"},
		{Machine: "cp-2", Member: "etcd-2", How: "power off through its BMC (redfish+http://10.0.0.2:80/systems/1) and read back Off"},
		{Machine: "cp-3", Member: "etcd-3", How: "power off through its BMC (redfish+http://10.0.0.3:80/systems/1) and read back Off"},
	}, p.Fence)
	assert.Contains(t, strings.Join(p.Steps, "\n"), "etcdutl snapshot restore --skip-hash-check --bump-revision 18020 --mark-compacted")
	assert.Equal(t, []string{"etcd-4", "etcd-0"}, []string{p.Candidates[0].Member, p.Candidates[1].Member})
}

// On a running hub, with witnesses so that it still hears a majority: two of three members go silent
// while their BMCs read them on (the far side of a partition, as far as the hub can tell), and the only
// member that answers is behind the mark. The plan names the survivor and the data at risk, and is
// blocked by both. Once their BMCs do not answer, the loss is for good (said, counted); once the
// survivor has caught up to the mark, the plan is ready.
func TestRecoveryPlanOnARunningHub(t *testing.T) {
	pool := newTestPool(3)
	pool.witnesses = []string{"w-1", "w-2"}
	r := newPassRig(t, pool, testPolicy(), nil)
	r.hub.cfg.BMCCheckInterval = time.Hour // only the start and a quorum loss check the BMCs
	r.hub.cfg.BMC.Retries = -1
	ctx := t.Context()
	var mu sync.Mutex
	var said []string
	r.hub.cfg.OnNotice = func(_ time.Time, msg string) { mu.Lock(); said = append(said, msg); mu.Unlock() }
	r.run(t)
	r.awaitPasses(t, 3)
	p := r.hub.RecoveryPlan(ctx)
	require.Len(t, p.Blockers, 1)
	assert.Contains(t, p.Blockers[0], "etcd's quorum is not lost")

	require.NoError(t, r.hub.SetSuspended(ctx, true, "test", "nothing power-cycled"))
	pool.mu.Lock()
	pool.behind["cp-0"] = 50
	pool.mu.Unlock()
	r.awaitPasses(t, 3)
	pool.mu.Lock()
	pool.frozen = true
	pool.dead["cp-1"], pool.dead["cp-2"] = true, true
	pool.mu.Unlock()
	lost := time.Now()
	require.Eventually(t, func() bool {
		st := r.hub.Status(ctx)
		return st.QuorumLoss != nil && len(st.QuorumLoss.Lost) == 2 && st.Machines[1].BMC != nil && st.Machines[1].BMC.Checked.After(lost)
	}, 10*time.Second, 10*time.Millisecond, "quorum lost, and the BMCs checked again at once")
	st := r.hub.Status(ctx)
	assert.False(t, st.QuorumLoss.ForGood, "their BMCs read them on")
	p = r.hub.RecoveryPlan(ctx)
	require.NotNil(t, p.Survivor)
	assert.Equal(t, "etcd-0", p.Survivor.Member)
	assert.Equal(t, uint64(50), p.DataAtRisk)
	require.Len(t, p.Blockers, 3, "%q", p.Blockers)
	assert.Contains(t, p.Blockers[0], "cp-1 (etcd-1): its BMC reads the host powered on")
	assert.Contains(t, p.Blockers[1], "cp-2 (etcd-2): its BMC reads the host powered on")
	assert.Contains(t, p.Blockers[2], "etcd-0 is at raft index")

	// Their BMCs stop answering: lost for good.
	inv := r.hub.inventory()
	inv.Machines = slices.Clone(inv.Machines)
	silent, err := bmc.ParseEndpoint("redfish+http://127.0.0.1:1/redfish/v1/Systems/x")
	require.NoError(t, err)
	inv.Machines[1].Endpoint, inv.Machines[2].Endpoint = silent, silent
	require.NoError(t, r.hub.SetInventory(inv))
	r.hub.checkBMCsOnce(ctx)
	require.Eventually(t, func() bool {
		l := r.hub.Status(ctx).QuorumLoss
		return l != nil && l.ForGood
	}, 10*time.Second, 10*time.Millisecond)
	mu.Lock()
	assert.True(t, slices.ContainsFunc(said, func(s string) bool { return strings.HasPrefix(s, "quorum lost FOR GOOD") }), "%q", said)
	mu.Unlock()
	p = r.hub.RecoveryPlan(ctx)
	require.Len(t, p.Blockers, 1, "%q", p.Blockers)
	assert.Contains(t, p.Blockers[0], "50 entries behind the journaled mark")
	assert.Contains(t, p.Fence[0].How, "does not answer: make sure by hand that it is off")

	pool.mu.Lock()
	pool.behind["cp-0"] = 0
	pool.mu.Unlock()
	p = r.hub.RecoveryPlan(ctx)
	assert.Empty(t, p.Blockers, "the survivor at the mark: ready")
	assert.Zero(t, p.DataAtRisk)
	assert.Equal(t, uint64(minBump), p.BumpRevision)
}
