package kube

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/hale-dev/hale/test/bmo"
	"github.com/hale-dev/hale/test/kubeenv"
)

// clusterapi.Metal3Host against metal3's real baremetal-operator (test mode: its own state machine, annotation
// handling and status; its fixture provisioner in place of Ironic and a BMC), with the operator's own
// CRDs. An externally provisioned host comes up powered on; Hale's reboot (its suffixed reboot
// annotation: off, kept off while it stays, on once Hale removes it) is seen through status.poweredOn as
// the operator reports it, and so are a fence (off, kept off) and the reboot that ends it; a host the
// operator treats as detached or paused is refused with the reason.
func TestMetal3HostWithTheRealOperator(t *testing.T) {
	t.Parallel() // beside the other real controllers' tests, each on its own API server
	c, cfg := kubeenv.StartWithMetal3(t, bmo.CRDs(t))
	ctx := t.Context()
	const ns = "metal3-host-1"
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "host-1-bmc"},
		StringData: map[string]string{"username": "admin", "password": "pw"}}))
	host := &unstructured.Unstructured{}
	host.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
	host.SetNamespace(ns)
	host.SetName("host-1")
	host.Object["spec"] = map[string]any{"online": true, "externallyProvisioned": true, "bootMACAddress": "52:54:00:00:00:01",
		"bmc": map[string]any{"address": "redfish://127.0.0.1:8000/redfish/v1/Systems/1", "credentialsName": "host-1-bmc"}}
	require.NoError(t, c.Create(ctx, host))
	op := bmo.Start(t, kubeenv.Kubeconfig(t, cfg, t.TempDir(), ""), ns)

	h := &clusterapi.Metal3Host{Client: c, Key: client.ObjectKey{Namespace: ns, Name: "host-1"}, Poll: 50 * time.Millisecond, Timeout: 30 * time.Second}
	get := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
		require.NoError(t, c.Get(ctx, h.Key, u))
		return u
	}
	require.Eventually(t, func() bool {
		st, _, err := h.Status(ctx)
		state, _, _ := unstructured.NestedString(get().Object, "status", "provisioning", "state")
		return err == nil && st == bmc.PowerOn && state == "externally provisioned"
	}, 60*time.Second, 100*time.Millisecond, "the operator registers the host and powers it on")

	start := time.Now()
	res, err := h.Reboot(ctx)
	require.NoError(t, err, op.Logs())
	assert.Equal(t, bmc.PowerOn, res.After)
	t.Logf("reboot through the operator: %v (%v)", time.Since(start).Round(time.Millisecond), res.Requests)
	assert.NotContains(t, get().GetAnnotations(), clusterapi.RebootAnnotation, "removed by Hale once off was seen")

	res, err = h.ForceOff(ctx)
	require.NoError(t, err)
	assert.Equal(t, bmc.PowerOff, res.After)
	v, ok := get().GetAnnotations()[clusterapi.RebootAnnotation]
	require.True(t, ok, "a fenced host keeps the annotation")
	assert.JSONEq(t, `{"mode":"hard"}`, v)
	time.Sleep(2 * time.Second) // the operator reconciles; the host must stay off
	st, _, err := h.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, bmc.PowerOff, st, "kept off while the annotation is there")

	res, err = h.Reboot(ctx)
	require.NoError(t, err)
	assert.Equal(t, bmc.PowerOn, res.After, "the reboot after a fence powers it on")

	// The operator's own record of what it did: its PowerOff and PowerOn Events on the host.
	var events corev1.EventList
	require.NoError(t, c.List(ctx, &events, client.InNamespace(ns)))
	reasons := map[string]int{}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == "host-1" {
			reasons[e.Reason] += max(int(e.Count), 1)
		}
	}
	assert.Equal(t, 2, reasons["PowerOff"], "the reboot and the fence: %v", reasons)
	assert.Equal(t, 3, reasons["PowerOn"], "at registration, after the reboot, after the fence: %v", reasons)

	for _, a := range []string{clusterapi.HostDetachedAnnotation, clusterapi.HostPausedAnnotation} {
		u := get()
		before := u.DeepCopy()
		u.SetAnnotations(map[string]string{a: ""})
		require.NoError(t, c.Patch(ctx, u, client.MergeFrom(before)))
		_, err = h.Reboot(ctx)
		require.ErrorContains(t, err, "is annotated "+a)
		u = get()
		before = u.DeepCopy()
		u.SetAnnotations(nil)
		require.NoError(t, c.Patch(ctx, u, client.MergeFrom(before)))
	}
}

// The states of a host as the real operator takes it through them (test mode): a host it provisions
// with an image (registering → inspecting → available → provisioning → provisioned) is rebooted the
// same way; one left available is refused at once, naming its state, where the operator ignores
// reboot annotations (found here: Hale used to wait its whole timeout for a power-off that never
// came, then ask whether the operator was running).
func TestMetal3HostStatesWithTheRealOperator(t *testing.T) {
	t.Parallel() // beside the other real controllers' tests, each on its own API server
	c, cfg := kubeenv.StartWithMetal3(t, bmo.CRDs(t))
	ctx := t.Context()
	kc := kubeenv.Kubeconfig(t, cfg, t.TempDir(), "")
	hosts := map[string]*clusterapi.Metal3Host{}
	for ns, image := range map[string]bool{"available": false, "provisioned": true} {
		require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
		require.NoError(t, c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "host-bmc"},
			StringData: map[string]string{"username": "admin", "password": "pw"}}))
		host := &unstructured.Unstructured{}
		host.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
		host.SetNamespace(ns)
		host.SetName("host")
		spec := map[string]any{"online": true, "bootMACAddress": "52:54:00:00:00:02",
			"bmc": map[string]any{"address": "redfish://127.0.0.1:8000/redfish/v1/Systems/1", "credentialsName": "host-bmc"}}
		if image {
			spec["image"] = map[string]any{"url": "http://127.0.0.1/image.qcow2", "checksum": "http://127.0.0.1/image.qcow2.sha256sum", "checksumType": "sha256"}
		}
		host.Object["spec"] = spec
		require.NoError(t, c.Create(ctx, host))
		bmo.Start(t, kc, ns)
		hosts[ns] = &clusterapi.Metal3Host{Client: c, Key: client.ObjectKey{Namespace: ns, Name: "host"}, Poll: 50 * time.Millisecond, Timeout: 30 * time.Second}
	}
	for state, h := range hosts {
		require.Eventually(t, func() bool {
			u, err := getHost(ctx, c, h.Key)
			got, _, _ := unstructured.NestedString(u.Object, "status", "provisioning", "state")
			return err == nil && got == state
		}, 90*time.Second, 200*time.Millisecond, "%s reaches %s", h.Key, state)
	}

	res, err := hosts["provisioned"].Reboot(ctx)
	require.NoError(t, err)
	assert.Equal(t, bmc.PowerOn, res.After)

	start := time.Now()
	_, err = hosts["available"].Reboot(ctx)
	require.ErrorContains(t, err, `BareMetalHost available/host is in state "available": baremetal-operator acts on reboot annotations only on a provisioned or externally provisioned host`)
	assert.Less(t, time.Since(start), 5*time.Second, "refused at once, not after the timeout")
	u, err := getHost(ctx, c, hosts["available"].Key)
	require.NoError(t, err)
	assert.NotContains(t, u.GetAnnotations(), clusterapi.RebootAnnotation, "nothing left behind")
}

// getHost reads a BareMetalHost as unstructured.
func getHost(ctx context.Context, c client.Client, key client.ObjectKey) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
	return u, c.Get(ctx, key, u)
}
