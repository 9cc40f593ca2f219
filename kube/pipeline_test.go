package kube

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/demo"
)

// The same pipeline in Kubernetes mode's journal: the demo topology (real etcd, agents, simulated
// BMCs) with a hub that leads a Lease and records its remediations as Remediation objects on a real
// kube-apiserver. A hung machine is healed once, and the object tells the whole story.
func TestHubOnRemediationObjects(t *testing.T) {
	c, cfg := startAPIServerConfig(t)
	ctx := t.Context()
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hale-system"}}))
	leaders := make(chan *Leader, 1)
	go func() {
		_ = Elect(ctx, cfg, c, "hale-system", "hale-hub", "hub-test", LeaseTiming{LeaseDuration: 2 * time.Second,
			RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond}, func(lctx context.Context, l *Leader) {
			leaders <- l
			<-lctx.Done()
		})
	}()
	leader := <-leaders

	timeline := &capture.Buffer{}
	tb, err := demo.Start(demo.Options{Dir: t.TempDir(), Timeline: timeline})
	require.NoError(t, err)
	t.Cleanup(func() {
		tb.Close()
		if t.Failed() {
			t.Logf("timeline:\n%s", timeline)
		}
	})
	require.NoError(t, tb.StartHub(demo.HubOptions{Store: NewJournal(c, "hale-system", leader.Epoch(), 5).WithFence(leader.Check)}))
	require.NoError(t, tb.Settle(ctx))

	tb.Hang(2)
	require.NoError(t, tb.WaitFor(ctx, 60*time.Second, "cp-2 healed", func() bool {
		n, st := tb.Remediations(2)
		return n == 1 && st == hub.Succeeded
	}))
	assert.Len(t, tb.Resets(2), 1, "one power action")

	var list v1alpha1.RemediationList
	require.NoError(t, c.List(ctx, &list, client.InNamespace("hale-system"), client.MatchingLabels{v1alpha1.LabelMachine: "cp-2"}))
	require.Len(t, list.Items, 1)
	obj := list.Items[0]
	assert.Equal(t, v1alpha1.PhaseSucceeded, obj.Status.Phase)
	assert.Equal(t, "hub", obj.Spec.RequestedBy)
	assert.Equal(t, []string{"power-cycle etcd-2", "await-healthy etcd-2"}, obj.Spec.Steps)
	assert.Equal(t, int64(leader.Epoch()), obj.Status.Epoch)
	var kinds []string
	for _, e := range obj.Status.History {
		kinds = append(kinds, e.Kind)
	}
	assert.Equal(t, []string{"note", "intent", "outcome", "outcome", "note"}, kinds, "begun, BMC intent, BMC outcome, recovered, succeeded")
}
