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
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube/outofservice"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/lab/inproc"
)

// prefixed is outofservice.Taints on Nodes named prefix+node: the package's API server is shared, and Nodes
// are cluster-scoped.
type prefixed struct {
	outofservice.Taints
	prefix string
}

func (p prefixed) Tainted(ctx context.Context) ([]string, error) {
	all, err := p.Taints.Tainted(ctx)
	var out []string
	for _, n := range all {
		if name, ok := strings.CutPrefix(n, p.prefix); ok {
			out = append(out, name)
		}
	}
	return out, err
}

func (p prefixed) Taint(ctx context.Context, node, why string) error {
	return p.Taints.Taint(ctx, p.prefix+node, why)
}

func (p prefixed) Untaint(ctx context.Context, node string) error {
	return p.Taints.Untaint(ctx, p.prefix+node)
}

// podWithVolume puts on Node node, made NotReady, a pod with a CSI volume attached (the
// attach-detach controller made its VolumeAttachment; the test answers as the driver's attacher),
// then deletes the pod: with no kubelet to answer, it stays Terminating, as on a node that is off.
func podWithVolume(t *testing.T, c client.Client, ns, node string) (*corev1.Pod, *storagev1.VolumeAttachment) {
	t.Helper()
	ctx := t.Context()
	var n corev1.Node
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: node}, &n))
	n.Annotations = map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"}
	require.NoError(t, c.Update(ctx, &n))
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletStopped",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	require.NoError(t, c.Status().Update(ctx, &n))

	driver := ns + ".csi.hale.dev"
	require.NoError(t, c.Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driver}, Spec: storagev1.CSIDriverSpec{AttachRequired: new(true)}}))
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: new(""), VolumeName: ns + "-data",
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	require.NoError(t, c.Create(ctx, claim))
	require.NoError(t, c.Create(ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: ns + "-data"}, Spec: corev1.PersistentVolumeSpec{
		AccessModes: claim.Spec.AccessModes, Capacity: claim.Spec.Resources.Requests, StorageClassName: "",
		ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: claim.Name, UID: claim.UID},
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "vol-1"}}}}))
	claim.Status.Phase, claim.Status.AccessModes, claim.Status.Capacity = corev1.ClaimBound, claim.Spec.AccessModes, claim.Spec.Resources.Requests
	require.NoError(t, c.Status().Update(ctx, claim))

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-0"}, Spec: corev1.PodSpec{NodeName: node,
		Containers: []corev1.Container{{Name: "db", Image: "db", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
		Volumes:    []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name}}}}}}
	require.NoError(t, c.Create(ctx, pod))
	var attachment *storagev1.VolumeAttachment
	require.Eventually(t, func() bool {
		var list storagev1.VolumeAttachmentList
		require.NoError(t, c.List(ctx, &list))
		for _, va := range list.Items {
			if va.Spec.NodeName == node {
				attachment = &va
			}
		}
		return attachment != nil
	}, 60*time.Second, 200*time.Millisecond, "the attach-detach controller attaches the pod's volume")
	attachment.Status.Attached = true
	require.NoError(t, c.Status().Update(ctx, attachment))
	require.NoError(t, c.Delete(ctx, pod))
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(pod), pod))
	require.NotNil(t, pod.DeletionTimestamp, "the pod stays, Terminating")
	return pod, attachment
}

// A machine whose class says fence is powered off (read back Off) and, once its BMC has read it Off
// for policy.outOfServiceAfter, its Node carries node.kubernetes.io/out-of-service=nodeshutdown:
// NoExecute (status, explain and the metric say so), and the real kube-controller-manager frees its
// pod with a volume: the pod garbage collector deletes it (stuck Terminating, no kubelet answers) and
// the attach-detach controller detaches its CSI volume (the VolumeAttachment goes). The BMC reading On
// takes the taint off. A taint an operator put on another Node is never taken off, and a new leader
// finds the taint an earlier one put on and keeps it while it can not yet tell.
func TestOutOfServiceTaintOnAFencedNode(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	tb := startInproc(t)
	inv, err := tb.Inventory()
	require.NoError(t, err)
	for _, m := range inv.Machines {
		createNode(t, c, ns+"-"+m.Node, "", true)
	}
	kubeenv.ControllerManager(t, cfg, "podgc", "attachdetach")
	pod, attachment := podWithVolume(t, c, ns, ns+"-"+inproc.Name(2))
	operators := ns + "-" + inv.Machines[0].Node
	var op corev1.Node // the operator's own taint, with no annotation of Hale's
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: operators}, &op))
	op.Spec.Taints = append(op.Spec.Taints, outofservice.Taint)
	require.NoError(t, c.Update(ctx, &op))
	taints := prefixed{outofservice.Taints{Client: c}, ns + "-"}
	reg := prometheus.NewRegistry()
	start := func() {
		require.NoError(t, tb.StartHub(inproc.HubOptions{Inventory: func(inv *pass.Inventory) {
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
	tainted := func(name string) bool { return outofservice.Has(new(node(name))) }
	tb.StopHub()
	start()
	require.NoError(t, tb.Settle(ctx))

	tb.Hang(2)
	fenced := time.Now()
	require.NoError(t, tb.WaitFor(ctx, 60*time.Second, "cp-2 fenced", func() bool { return tb.Sim().PowerState(inproc.Name(2)) == "Off" }))
	// The Node first, then the hub's word: the hub records the taint once the API server has answered
	// its write, a moment after the Node carries it (the full lane read the status in between once).
	require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "cp-2's Node tainted", func() bool { return tainted(inproc.Name(2)) }))
	require.NoError(t, tb.WaitFor(ctx, 5*time.Second, "the hub's status saying so", func() bool { return tb.Hub().Status(ctx).Machines[2].OutOfService != "" }))
	t.Logf("fence → taint: %v (policy.outOfServiceAfter 2s, BMC read every 0.5 s)", time.Since(fenced).Round(100*time.Millisecond))
	n := node(inproc.Name(2))
	assert.Contains(t, n.Spec.Taints, corev1.Taint{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute,
		TimeAdded: n.Spec.Taints[len(n.Spec.Taints)-1].TimeAdded})
	assert.Contains(t, n.Annotations[outofservice.Annotation], "its BMC read the power Off at")
	st := tb.Hub().Status(ctx)
	assert.Contains(t, st.Machines[2].OutOfService, "fenced by remediation")
	e, err := tb.Hub().Explain(ctx, inproc.Name(2))
	require.NoError(t, err)
	assert.Contains(t, strings.Join(e.Brakes, "; "), "carries the out-of-service taint")
	assert.Equal(t, 1, testutil.CollectAndCount(reg, "hale_hub_out_of_service"))
	assert.False(t, tainted(inproc.Name(1)), "no other Node")
	taintedAt := time.Now()
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})) &&
			apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(attachment), &storagev1.VolumeAttachment{}))
	}, 90*time.Second, 200*time.Millisecond, "the pod deleted and its volume detached by the real kube-controller-manager")
	t.Logf("taint → pod deleted and its volume detached: %v (the pod garbage collector runs every 20 s)", time.Since(taintedAt).Round(100*time.Millisecond))

	// A new leader finds the taint and keeps it while cp-2 stays off (never taken off meanwhile: the
	// pass cannot tell until its BMC has been read).
	tb.StopHub()
	reg = prometheus.NewRegistry()
	start()
	require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "the new leader's view of cp-2's taint", func() bool {
		return tb.Hub().Status(ctx).Machines[2].OutOfService != ""
	}))
	assert.True(t, tainted(inproc.Name(2)))
	assert.NotContains(t, strings.Join(tb.Hub().Timeline(), "\n"), "out-of-service taint taken off")

	// Someone powers cp-2 on: the BMC reads On and the taint goes at once, before it is heard.
	tb.Sim().SetPowerState(inproc.Name(2), "On")
	require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "the taint off cp-2's Node", func() bool { return !tainted(inproc.Name(2)) }))
	_, ours := node(inproc.Name(2)).Annotations[outofservice.Annotation]
	assert.False(t, ours)
	assert.True(t, tainted(inv.Machines[0].Node), "the operator's taint on cp-0 stays")
}
