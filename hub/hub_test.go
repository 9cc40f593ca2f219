package hub

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/quorum"
)

// /healthz's word on the pipeline: a leader whose passes stopped must not look alive.
func TestStalled(t *testing.T) {
	now := t0.Add(time.Hour)
	for _, tc := range []struct {
		name              string
		started, lastPass time.Time
		want              string
	}{
		{"not started", time.Time{}, time.Time{}, "the pipeline has not started"},
		{"warming up", now.Add(-time.Minute), time.Time{}, ""},
		{"no first pass after the grace", now.Add(-3 * time.Minute), time.Time{}, "no pass since the pipeline started 3m0s ago"},
		{"passing", now.Add(-time.Hour), now.Add(-200 * time.Millisecond), ""},
		{"stalled", now.Add(-time.Hour), now.Add(-45 * time.Second), "the pipeline stalled: no pass for 45s (one is due every 200ms)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &Hub{cfg: Config{Tick: 200 * time.Millisecond}, started: tc.started, lastPass: tc.lastPass}
			got := h.Stalled(now, 2*time.Minute, 30*time.Second)
			if tc.want == "" {
				assert.Empty(t, got)
			} else {
				assert.Contains(t, got, tc.want)
			}
		})
	}
}

// A replace in Kubernetes mode names its new member with a placeholder (the owner picks the real
// name). Once the replacement has joined (here etcd-3, as a learner: kubeadm's learner mode), the
// planner is told its real steps, promote included, and a fence of that learner, which looks free,
// waits: promote etcd-3 → power-off etcd-3 → remove etcd-1 would leave 1 of 2 voters healthy.
func TestInFlightReplaceIsToldByItsRealMember(t *testing.T) {
	placeholder := quorum.Shape{Order: quorum.ScaleUpFirst, Join: quorum.JoinAsVoter}.Steps("etcd-1", "etcd-1"+newMemberSuffix)
	h := &Hub{running: map[string]*running{"cp-1": {
		rem:  Remediation{Members: []string{"etcd-1", "etcd-2"}},
		plan: quorum.Plan{Strategy: quorum.Replace, Steps: placeholder}, // as rebuilt from the journal: no shape
		next: 0,
	}}}
	inv := Inventory{Machines: []Machine{
		{MachineRef: MachineRef{Name: "cp-1", Member: "etcd-1"}, Strategy: quorum.Replace},
		{MachineRef: MachineRef{Name: "cp-3", Member: "etcd-3"}, Strategy: quorum.Fence},
	}}
	c := quorum.Cluster{Members: []quorum.Member{{Name: "etcd-1", Health: quorum.Healthy}, {Name: "etcd-2", Health: quorum.Healthy},
		{Name: "etcd-3", Learner: true, Health: quorum.Healthy}}}

	// Not joined yet: the placeholder steps stand.
	h.cluster = quorum.Cluster{Members: c.Members[:2]}
	_, steps := h.stillToCome("cp-1")
	assert.Equal(t, placeholder, steps)

	h.cluster = c
	_, steps = h.stillToCome("cp-1")
	assert.Equal(t, quorum.Shape{Order: quorum.ScaleUpFirst, Join: quorum.JoinAsLearner}.Steps("etcd-1", "etcd-3"), steps)

	in := quorum.Input{Cluster: c, Policy: quorum.DefaultPolicy(), Machines: append(h.inFlight(inv),
		quorum.Machine{Name: "cp-3", Member: "etcd-3", Unhealthy: true, Strategy: quorum.Fence})}
	out, err := quorum.PlanPass(in)
	require.NoError(t, err)
	assert.Empty(t, out.Started())
	assert.Contains(t, out.Decisions[1].Reason, "fencing etcd-3 is unsafe beside the work in flight")
	assert.Contains(t, out.Decisions[1].Reason, "promote etcd-3")
}
