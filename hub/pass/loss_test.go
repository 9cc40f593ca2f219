package pass

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/quorum"
)

func TestAssessLoss(t *testing.T) {
	at := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	inv := Inventory{}
	for _, n := range []string{"1", "2", "3"} {
		ep, err := bmcval.ParseEndpoint("redfish+http://10.0.0." + n + "/redfish/v1/Systems/1")
		require.NoError(t, err)
		inv.Machines = append(inv.Machines, Machine{MachineRef: assess.MachineRef{Name: "cp-" + n, Node: "cp-" + n, Member: "etcd-" + n}, Endpoint: ep})
	}
	inv.Machines = append(inv.Machines, Machine{MachineRef: assess.MachineRef{Name: "cp-4", Node: "cp-4", Member: "etcd-4"}}) // no BMC
	cluster := func(healthy ...string) quorum.Cluster {
		var c quorum.Cluster
		for _, n := range []string{"etcd-1", "etcd-2", "etcd-3"} {
			m := quorum.Member{Name: n, Health: quorum.Unhealthy}
			for _, h := range healthy {
				if h == n {
					m.Health = quorum.Healthy
				}
			}
			c.Members = append(c.Members, m)
		}
		return c
	}
	// decided: every voter that does not count is silent (answers no majority of the observers).
	decided := func(c quorum.Cluster, needs map[string]OperatorNeed) decision {
		d := decision{cluster: c, outcome: quorum.Outcome{Budget: c.Budget(quorum.Policy{})}, needs: needs}
		for _, m := range c.Members {
			if !m.CountsHealthy() {
				d.silent = append(d.silent, m.Name)
			}
		}
		return d
	}
	answering := func(d decision, members ...string) decision {
		d.silent = slices.DeleteFunc(d.silent, func(m string) bool { return slices.Contains(members, m) })
		return d
	}
	unreachable := BMCReadiness{Checked: at, Problem: bmcval.ProblemUnreachable, Error: "no answer"}
	on := BMCReadiness{Checked: at, Ready: true, Power: bmcval.PowerOn}
	off := BMCReadiness{Checked: at, Ready: true, Power: bmcval.PowerOff}
	for _, tc := range []struct {
		name    string
		d       decision
		bmcs    map[string]BMCReadiness
		forGood bool
		lost    []LostVoter // nil: no loss (quorum holds)
	}{
		{name: "quorum holds: no loss", d: decided(cluster("etcd-1", "etcd-2"), nil)},
		{name: "both BMCs silent, or off: lost for good", d: decided(cluster("etcd-1"), nil),
			bmcs: map[string]BMCReadiness{"cp-1": on, "cp-2": unreachable, "cp-3": off}, forGood: true,
			lost: []LostVoter{{Member: "etcd-2", Machine: "cp-2", Evidence: "its BMC: Unreachable at 03:00:00Z", BMCProblem: bmcval.ProblemUnreachable, ForGood: true},
				{Member: "etcd-3", Machine: "cp-3", Evidence: "its BMC read the power Off at 03:00:00Z", ForGood: true}}},
		{name: "the far side: given up, but the BMC reads the host on", d: decided(cluster("etcd-1"), map[string]OperatorNeed{"cp-2": NeedGaveUp, "cp-3": NeedUnseen}),
			bmcs: map[string]BMCReadiness{"cp-2": on, "cp-3": unreachable},
			lost: []LostVoter{{Member: "etcd-2", Machine: "cp-2", Evidence: "maxAttempts power-cycles did not bring it back", PoweredOn: true},
				{Member: "etcd-3", Machine: "cp-3", Evidence: "its BMC: Unreachable at 03:00:00Z; power-cycled, and nobody has seen it since", BMCProblem: bmcval.ProblemUnreachable, ForGood: true}}},
		{name: "given up, its BMC not read yet: not for good", d: decided(cluster("etcd-1"), map[string]OperatorNeed{"cp-2": NeedGaveUp, "cp-3": NeedGaveUp}),
			bmcs: map[string]BMCReadiness{"cp-3": off},
			lost: []LostVoter{{Member: "etcd-2", Machine: "cp-2", Evidence: "maxAttempts power-cycles did not bring it back"},
				{Member: "etcd-3", Machine: "cp-3", Evidence: "its BMC read the power Off at 03:00:00Z; maxAttempts power-cycles did not bring it back", ForGood: true}}},
		{name: "the survivor fails its own probe (no leader) but answers: not lost", d: answering(decided(cluster(), nil), "etcd-1"),
			bmcs: map[string]BMCReadiness{"cp-1": on, "cp-2": off, "cp-3": unreachable}, forGood: true,
			lost: []LostVoter{{Member: "etcd-2", Machine: "cp-2", Evidence: "its BMC read the power Off at 03:00:00Z", ForGood: true},
				{Member: "etcd-3", Machine: "cp-3", Evidence: "its BMC: Unreachable at 03:00:00Z", BMCProblem: bmcval.ProblemUnreachable, ForGood: true}}},
		{name: "one voter lost for good, another not counting but not silent yet: with the survivor it makes a quorum again, not for good",
			d: answering(decided(cluster("etcd-1"), nil), "etcd-2"), bmcs: map[string]BMCReadiness{"cp-2": on, "cp-3": off},
			lost: []LostVoter{{Member: "etcd-3", Machine: "cp-3", Evidence: "its BMC read the power Off at 03:00:00Z", ForGood: true}}},
		{name: "quorum lost while every member answers (no leader elected): no lost voter, not for good", d: answering(decided(cluster("etcd-1"), nil), "etcd-2", "etcd-3"),
			bmcs: map[string]BMCReadiness{"cp-2": off, "cp-3": off}, lost: []LostVoter{}},
		{name: "silence alone is no evidence", d: decided(cluster(), nil), bmcs: map[string]BMCReadiness{"cp-1": on},
			lost: []LostVoter{{Member: "etcd-1", Machine: "cp-1", PoweredOn: true}, {Member: "etcd-2", Machine: "cp-2"}, {Member: "etcd-3", Machine: "cp-3"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := assessLoss(tc.d, inv, tc.bmcs)
			if tc.lost == nil {
				assert.Nil(t, l)
				return
			}
			require.NotNil(t, l)
			assert.Equal(t, tc.forGood, l.ForGood)
			if len(tc.lost) == 0 {
				assert.Empty(t, l.Lost)
			} else {
				assert.Equal(t, tc.lost, l.Lost)
			}
			if tc.forGood {
				assert.Contains(t, l.String(), "quorum lost FOR GOOD")
			} else {
				assert.NotContains(t, l.String(), "FOR GOOD")
			}
		})
	}
}

// Lost for good is said when it begins and when it ends; a new loss, or new evidence, asks for a
// fresh check of the BMCs.
func TestSayLoss(t *testing.T) {
	lost := func(forGood bool, evidence string) *QuorumLoss {
		return &QuorumLoss{Voters: 3, HealthyVoters: 1, Quorum: 2, ForGood: forGood,
			Lost: []LostVoter{{Member: "etcd-2", Evidence: evidence, ForGood: forGood}, {Member: "etcd-3", Evidence: evidence, ForGood: forGood}}}
	}
	for _, tc := range []struct {
		name        string
		before, now *QuorumLoss
		check       bool
		say         string
	}{
		{name: "no loss", check: false},
		{name: "quorum lost: check the BMCs", now: lost(false, ""), check: true},
		{name: "nothing new", before: lost(false, ""), now: lost(false, "")},
		{name: "new evidence, for good", before: lost(false, ""), now: lost(true, "its BMC: Unreachable"), check: true, say: "quorum lost FOR GOOD"},
		{name: "no longer", before: lost(true, "x"), now: lost(false, ""), check: true, say: "quorum no longer lost for good: quorum lost (1 of 3"},
		{name: "quorum back", before: lost(true, "x"), say: "quorum no longer lost for good: quorum is back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rd Ready
			queueLoss(&rd, tc.before, tc.now)
			assert.Equal(t, tc.check, rd.CheckBMCs)
			if tc.say == "" {
				assert.Empty(t, rd.Notices)
				return
			}
			require.Len(t, rd.Notices, 1)
			assert.Equal(t, ReasonQuorumLostForGood, rd.Notices[0].Reason)
			assert.Contains(t, rd.Notices[0].Message, tc.say)
		})
	}
}
