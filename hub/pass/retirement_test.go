package pass

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/hale-dev/hale/health/report"
	"github.com/hale-dev/hale/hub/assess"
)

// Where a retired member stands: rejoined on a fresh report of the new cluster from its own agent, or
// from another member of the new cluster that reached it, as itself and of the new cluster, at its
// client URL (before its own agent's first report: the rejoined agent waits on its key's enrolment);
// never on the old cluster's view, an unreachable or not yet started member, or a stale report.
func TestWhereARetiredMemberStands(t *testing.T) {
	now := time.Date(2026, 11, 29, 3, 0, 0, 0, time.UTC)
	stale := 10 * time.Second
	r := Retirement{Token: "hale-old-1", Cluster: "old", Quorum: 2, Members: []Retiree{{"cp-1", "etcd-1"}}}
	x := r.Members[0]
	yes, no := true, false
	view := func(node, cluster, local string, age time.Duration, members ...report.EtcdMember) report.Report {
		return report.Report{Node: node, SentAt: now.Add(-age), Etcd: &report.EtcdView{ClusterID: cluster, LocalName: local, Members: members}}
	}
	member := func(reachable *bool) report.EtcdMember {
		return report.EtcdMember{Name: "etcd-1", Reachable: reachable}
	}
	for _, tc := range []struct {
		name              string
		report            report.Report
		rejoined, runsOld bool
	}{
		{"its own agent, of the new cluster", view("cp-1", "new", "etcd-1", time.Second), true, false},
		{"its own agent, of the old cluster", view("cp-1", "old", "etcd-1", time.Second), false, true},
		{"the survivor reached it in the new cluster", view("cp-2", "new", "etcd-2", time.Second, member(&yes)), true, false},
		{"the survivor did not reach it", view("cp-2", "new", "etcd-2", time.Second, member(&no)), false, false},
		{"added, not started yet", view("cp-2", "new", "etcd-2", time.Second, member(nil)), false, false},
		{"reached in the old cluster", view("cp-0", "old", "etcd-0", time.Second, member(&yes)), false, false},
		{"the survivor's report is stale", view("cp-2", "new", "etcd-2", time.Minute, member(&yes)), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := assess.Observations{Now: now, Reports: map[string]report.Report{tc.report.Node: tc.report},
				HubPeers: map[string]report.PeerView{tc.report.Node: {Name: tc.report.Node, State: report.PeerAlive}}}
			rejoined, runsOld := r.Where(x, obs, stale)
			assert.Equal(t, tc.rejoined, rejoined, "rejoined")
			assert.Equal(t, tc.runsOld, runsOld, "runs the old cluster")
			_, held := r.Hold(x.Machine, obs, stale)
			assert.Equal(t, !tc.rejoined, held, "held while not rejoined")
		})
	}
}
