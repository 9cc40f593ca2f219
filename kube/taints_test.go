package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/demo"
)

// prefixed is NodeTaints on Nodes named prefix+node: the package's API server is shared, and Nodes
// are cluster-scoped.
type prefixed struct {
	NodeTaints
	prefix string
}

func (p prefixed) Tainted(ctx context.Context) ([]string, error) {
	all, err := p.NodeTaints.Tainted(ctx)
	var out []string
	for _, n := range all {
		if name, ok := strings.CutPrefix(n, p.prefix); ok {
			out = append(out, name)
		}
	}
	return out, err
}

func (p prefixed) Taint(ctx context.Context, node, why string) error {
	return p.NodeTaints.Taint(ctx, p.prefix+node, why)
}

func (p prefixed) Untaint(ctx context.Context, node string) error {
	return p.NodeTaints.Untaint(ctx, p.prefix+node)
}

// A machine whose class says fence is powered off (read back Off) and, once its BMC has read it Off
// for policy.outOfServiceAfter, its Node carries node.kubernetes.io/out-of-service=nodeshutdown:
// NoExecute (status, explain and the metric say so); the BMC reading On takes it off. A taint an
// operator put on another Node is never taken off, and a new leader finds the taint an earlier one
// put on and takes it off when it is no longer wanted.
func TestOutOfServiceTaintOnAFencedNode(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	tb := startTestbed(t)
	inv, err := tb.Inventory()
	require.NoError(t, err)
	for _, m := range inv.Machines {
		createNode(t, c, ns+"-"+m.Node, "", true)
	}
	operators := ns + "-" + inv.Machines[0].Node
	require.NoError(t, NodeTaints{Client: c}.update(ctx, operators, func(n *corev1.Node) bool {
		n.Spec.Taints = append(n.Spec.Taints, OutOfServiceTaint)
		return true
	}))
	taints := prefixed{NodeTaints{Client: c}, ns + "-"}
	reg := prometheus.NewRegistry()
	start := func() {
		require.NoError(t, tb.StartHub(demo.HubOptions{Inventory: func(inv *pass.Inventory) {
			inv.Machines[2].Strategy = quorum.Fence
			inv.Policy.OutOfServiceAfter = 2 * time.Second
		}, Configure: func(cfg *hub.Config) {
			cfg.OutOfService, cfg.FenceWatch, cfg.Metrics = taints, 500*time.Millisecond, reg
		}}))
	}
	node := func(name string) corev1.Node {
		var n corev1.Node
		require.NoError(t, c.Get(ctx, client.ObjectKey{Name: ns + "-" + name}, &n))
		return n
	}
	tainted := func(name string) bool { return hasOutOfService(new(node(name))) }
	tb.StopHub()
	start()
	require.NoError(t, tb.Settle(ctx))

	tb.Hang(2)
	fenced := time.Now()
	require.NoError(t, tb.WaitFor(ctx, 60*time.Second, "cp-2 fenced", func() bool { return tb.Sim().PowerState(demo.Name(2)) == "Off" }))
	require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "cp-2's Node tainted", func() bool { return tainted(demo.Name(2)) }))
	t.Logf("fence → taint: %v (policy.outOfServiceAfter 2s, BMC read every 0.5 s)", time.Since(fenced).Round(100*time.Millisecond))
	n := node(demo.Name(2))
	assert.Contains(t, n.Spec.Taints, corev1.Taint{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute,
		TimeAdded: n.Spec.Taints[len(n.Spec.Taints)-1].TimeAdded})
	assert.Contains(t, n.Annotations[OutOfServiceAnnotation], "its BMC read the power Off at")
	st := tb.Hub().Status(ctx)
	assert.Contains(t, st.Machines[2].OutOfService, "fenced by remediation")
	e, err := tb.Hub().Explain(ctx, demo.Name(2))
	require.NoError(t, err)
	assert.Contains(t, strings.Join(e.Brakes, "; "), "carries the out-of-service taint")
	assert.Equal(t, 1, testutil.CollectAndCount(reg, "hale_hub_out_of_service"))
	assert.False(t, tainted(demo.Name(1)), "no other Node")

	// A new leader finds the taint and keeps it while cp-2 stays off (never taken off meanwhile: the
	// pass cannot tell until its BMC has been read).
	tb.StopHub()
	reg = prometheus.NewRegistry()
	start()
	require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "the new leader's view of cp-2's taint", func() bool {
		return tb.Hub().Status(ctx).Machines[2].OutOfService != ""
	}))
	assert.True(t, tainted(demo.Name(2)))
	assert.NotContains(t, strings.Join(tb.Hub().Timeline(), "\n"), "out-of-service taint taken off")

	// Someone powers cp-2 on: the BMC reads On and the taint goes at once, before it is heard.
	tb.Sim().SetPowerState(demo.Name(2), "On")
	require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "the taint off cp-2's Node", func() bool { return !tainted(demo.Name(2)) }))
	_, ours := node(demo.Name(2)).Annotations[OutOfServiceAnnotation]
	assert.False(t, ours)
	assert.True(t, tainted(inv.Machines[0].Node), "the operator's taint on cp-0 stays")
}
