package recoveryplan

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// policy is the shipped policy.
func policy(t *testing.T) pass.Policy {
	t.Helper()
	p, err := inventory.PolicyFile{}.Validate()
	require.NoError(t, err)
	return p
}

func TestOf(t *testing.T) {
	now := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	inv := pass.Inventory{Policy: policy(t)}
	for i := range 5 {
		n := string(rune('0' + i))
		ep, err := bmc.ParseEndpoint("redfish+http://10.0.0." + n + "/redfish/v1/Systems/1")
		require.NoError(t, err)
		inv.Machines = append(inv.Machines, pass.Machine{MachineRef: assess.MachineRef{Name: "cp-" + n, Node: "cp-" + n, Member: "etcd-" + n}, Endpoint: ep})
	}
	// 5 members, 3 lost for good (cp-1: BMC silent, cp-2 and cp-3: power Off); cp-0 and cp-4 answer,
	// cp-4 further ahead.
	loss := &pass.QuorumLoss{Voters: 5, HealthyVoters: 2, Quorum: 3, ForGood: true, Lost: []pass.LostVoter{
		{Member: "etcd-1", Machine: "cp-1", Evidence: "its BMC: Unreachable at 02:59:00Z", BMCProblem: bmc.ProblemUnreachable, ForGood: true},
		{Member: "etcd-2", Machine: "cp-2", Evidence: "its BMC read the power Off at 02:59:00Z", ForGood: true},
		{Member: "etcd-3", Machine: "cp-3", Evidence: "its BMC read the power Off at 02:59:00Z", ForGood: true}}}
	report := func(node string, index uint64, cluster string) health.Report {
		return health.Report{Node: node, SentAt: now.Add(-time.Second),
			Etcd: &health.EtcdView{ClusterID: cluster, LocalName: "etcd-" + strings.TrimPrefix(node, "cp-"), RaftTerm: 7, RaftIndex: index, ObservedAt: now.Add(-time.Second)}}
	}
	obs := func(rs ...health.Report) assess.Observations {
		o := assess.Observations{Now: now, Reports: map[string]health.Report{}, HubPeers: map[string]health.PeerView{}}
		for _, r := range rs {
			o.Reports[r.Node] = r
			o.HubPeers[r.Node] = health.PeerView{Name: r.Node, State: health.PeerAlive}
		}
		return o
	}
	farSide := &pass.QuorumLoss{Voters: 3, HealthyVoters: 1, Quorum: 2, Lost: []pass.LostVoter{
		{Member: "etcd-1", Machine: "cp-1", Evidence: "maxAttempts power-cycles did not bring it back", PoweredOn: true},
		{Member: "etcd-2", Machine: "cp-2"}}}
	farSideAnswers := obs(report("cp-4", 90_100, "c1"), report("cp-1", 95_000, "c1")) // etcd-4, etcd-1 and etcd-2 its voters
	mark := &pass.RaftMark{ClusterID: "c1", Term: 7, Index: 90_000, Member: "etcd-2", At: now.Add(-time.Minute)}
	answering := obs(report("cp-0", 80_000, "c1"), report("cp-4", 90_100, "c1"),
		report("cp-1", 95_000, "c1")) // a lost member's stale report never makes it a survivor
	confirmed := operator.RecoverRequest{ConfirmLost: []string{"cp-1"}} // its BMC does not answer: the operator's word
	for _, tc := range []struct {
		name      string
		st        operator.Status
		obs       assess.Observations
		req       operator.RecoverRequest
		survivor  string
		atRisk    uint64
		bump      uint64
		blockedBy []string
	}{
		{name: "quorum held", st: operator.Status{}, obs: answering, survivor: "etcd-1", bump: bumpWithoutMark, blockedBy: []string{"quorum is not lost"}},
		{name: "the hub does not plan", st: operator.Status{NotPlanning: "hears 2 of 4 expected observers"}, obs: answering, survivor: "etcd-1", bump: bumpWithoutMark,
			blockedBy: []string{"the hub does not plan (hears 2 of 4 expected observers)"}},
		{name: "lost for good: the survivor furthest ahead, not the first listed", st: operator.Status{QuorumLoss: loss, RaftMark: mark}, obs: answering, req: confirmed,
			survivor: "etcd-4", bump: 90_100 / 5},
		{name: "a member the hub cannot fence needs the operator's word", st: operator.Status{QuorumLoss: loss, RaftMark: mark}, obs: answering,
			survivor: "etcd-4", bump: 90_100 / 5, blockedBy: []string{"cp-1 (etcd-1): the hub cannot fence it (its BMC (redfish+http://10.0.0.1:80/systems/1) does not answer): make sure it is off", "--confirm-lost cp-1"}},
		{name: "every survivor behind the mark", st: operator.Status{QuorumLoss: loss, RaftMark: mark}, obs: obs(report("cp-0", 80_000, "c1")), req: confirmed,
			survivor: "etcd-0", atRisk: 10_000, bump: 10_000 + 90_000/5, blockedBy: []string{"etcd-0 is at raft index 80000, 10000 entries behind the journaled mark 90000", "--accept-data-loss 10000"}},
		{name: "the loss accepted by its size", st: operator.Status{QuorumLoss: loss, RaftMark: mark}, obs: obs(report("cp-0", 80_000, "c1")),
			req: operator.RecoverRequest{ConfirmLost: []string{"cp-1"}, AcceptDataLoss: 10_000}, survivor: "etcd-0", atRisk: 10_000, bump: 10_000 + 90_000/5},
		{name: "the loss accepted by another size", st: operator.Status{QuorumLoss: loss, RaftMark: mark}, obs: obs(report("cp-0", 80_000, "c1")),
			req: operator.RecoverRequest{ConfirmLost: []string{"etcd-1"}, AcceptDataLoss: 9_999}, survivor: "etcd-0", atRisk: 10_000, bump: 10_000 + 90_000/5,
			blockedBy: []string{"10000 entries behind"}},
		{name: "a mark of another cluster says nothing", st: operator.Status{QuorumLoss: loss, RaftMark: &pass.RaftMark{ClusterID: "old", Index: 1 << 40}}, obs: answering, req: confirmed,
			survivor: "etcd-4", bump: bumpWithoutMark},
		{name: "no survivor", st: operator.Status{QuorumLoss: loss, RaftMark: mark}, obs: obs(), req: confirmed, bump: bumpWithoutMark, blockedBy: []string{"no member answers"}},
		{name: "the far side: a lost member's BMC reads it on", obs: farSideAnswers, survivor: "etcd-4", bump: 90_100 / 5,
			st: operator.Status{RaftMark: mark, QuorumLoss: farSide},
			blockedBy: []string{"cp-1 (etcd-1): its BMC reads the host powered on; it may be serving on the far side of a partition",
				"cp-2 (etcd-2): nothing says it will not come back (no evidence)"}},
		{name: "the far side, confirmed by name", obs: farSideAnswers, survivor: "etcd-4", bump: 90_100 / 5, req: operator.RecoverRequest{ConfirmLost: []string{"cp-1", "cp-2"}},
			st: operator.Status{RaftMark: mark, QuorumLoss: farSide}},
		{name: "a voter neither lost nor answering (a hub that has just started)", obs: obs(report("cp-4", 90_100, "c1")), req: confirmed,
			survivor: "etcd-4", bump: 90_100 / 5, st: operator.Status{RaftMark: mark, QuorumLoss: loss, Machines: votingMachines(5)},
			blockedBy: []string{"cp-0 (etcd-0): neither lost nor answering in the hub's view"}},
		{name: "members that answer, as many as the old quorum: no loss for good", obs: answering, survivor: "etcd-1", bump: 95_000 / 5,
			st:        operator.Status{RaftMark: mark, QuorumLoss: &pass.QuorumLoss{Voters: 3, Quorum: 2}},
			blockedBy: []string{"etcd-1, etcd-4, etcd-0 answer: 3 of the old cluster's members, its quorum (2): quorum is not lost for good"}},
		{name: "one voter lost, the two others answer: they are its quorum", obs: obs(report("cp-0", 80_000, "c1"), report("cp-4", 90_100, "c1")), req: confirmed,
			survivor: "etcd-4", bump: 90_100 / 5, st: operator.Status{RaftMark: mark, QuorumLoss: &pass.QuorumLoss{Voters: 3, HealthyVoters: 1, Quorum: 2, Lost: []pass.LostVoter{
				{Member: "etcd-1", Machine: "cp-1", Evidence: "its BMC read the power Off at 02:59:00Z", ForGood: true}}}},
			blockedBy: []string{"etcd-4, etcd-0 answer: 2 of the old cluster's members, its quorum (2): quorum is not lost for good while they answer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.st.Time = now
			p := Of(tc.st, inv, tc.obs, tc.req)
			if tc.survivor == "" {
				assert.Nil(t, p.Survivor)
			} else if assert.NotNil(t, p.Survivor) {
				assert.Equal(t, tc.survivor, p.Survivor.Member)
			}
			assert.Equal(t, tc.atRisk, p.DataAtRisk)
			assert.Equal(t, max(tc.bump, MinBump), p.BumpRevision, p.BumpWhy)
			blockers := strings.Join(p.Blockers, "\n")
			if len(tc.blockedBy) == 0 {
				assert.Empty(t, p.Blockers)
			}
			for _, b := range tc.blockedBy {
				assert.Contains(t, blockers, b)
			}
			text := p.String()
			assert.Contains(t, text, "nothing was changed: `hub recover --yes` carries the plan out")
			assert.Equal(t, len(p.Blockers) > 0, strings.Contains(text, "NOT READY"))
		})
	}

	p := Of(operator.Status{Time: now, QuorumLoss: loss, RaftMark: mark}, inv, answering, confirmed)
	assert.Equal(t, []quorum.FenceStep{
		{Machine: "cp-1", Member: "etcd-1", How: "its BMC (redfish+http://10.0.0.1:80/systems/1) does not answer: make sure by hand that it is off, and confirm it by name", ByHand: true},
		{Machine: "cp-2", Member: "etcd-2", How: "power off through its BMC (redfish+http://10.0.0.2:80/systems/1) and read back Off"},
		{Machine: "cp-3", Member: "etcd-3", How: "power off through its BMC (redfish+http://10.0.0.3:80/systems/1) and read back Off"},
	}, p.Fence)
	assert.Contains(t, strings.Join(p.Steps, "\n"), "revision bump 18020, the latest revision marked compacted")
	assert.Equal(t, []string{"etcd-4", "etcd-0"}, []string{p.Candidates[0].Member, p.Candidates[1].Member})
}

// votingMachines is the status of n machines cp-0… whose members etcd-0… are voters.
func votingMachines(n int) []operator.MachineStatus {
	var out []operator.MachineStatus
	for i := range n {
		out = append(out, operator.MachineStatus{Name: fmt.Sprintf("cp-%d", i), Member: fmt.Sprintf("etcd-%d", i), Role: "voter"})
	}
	return out
}

// The pause an etcd recovery holds the hub with is told from the operator's own, by its reason.
func TestPauseToken(t *testing.T) {
	tests := []struct {
		pause *pass.Brake
		token string
	}{
		{nil, ""},
		{&pass.Brake{By: "alice", Reason: "maintenance window"}, ""},
		{&pass.Brake{By: "alice", Reason: PauseReason("hale-c1-7")}, "hale-c1-7"},
		{&pass.Brake{By: "alice", Reason: PauseReason("hale-c1-7") + " under way (hub recover)"}, "hale-c1-7"},
		{&pass.Brake{By: "alice", Reason: PauseReason("")}, ""},
	}
	for _, tt := range tests {
		token, ok := PauseToken(tt.pause)
		assert.Equal(t, tt.token, token, "%+v", tt.pause)
		assert.Equal(t, tt.token != "", ok, "%+v", tt.pause)
	}
}
