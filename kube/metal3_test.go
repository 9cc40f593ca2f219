package kube

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/hale-dev/hale/test/metal3sim"
)

// clusterapi.Metal3Host's power operations through the reboot annotation, against the operator stand-in and a
// simulated BMC: a fence powers the host off hard and keeps it off (the annotation stays) until a
// reboot removes it; a hard cycle asks for mode hard; a paused host is refused with the reason.
func TestMetal3HostPower(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	sim, err := bmcsim.Start(bmcsim.Config{Username: "admin", Password: "pw", PlainHTTP: true,
		Systems: []bmcsim.SystemConfig{{ID: "1", ShutdownDelay: 20 * time.Millisecond, CycleOffDuration: 20 * time.Millisecond}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sim.Close() })
	ep, err := bmc.ParseEndpoint(sim.Endpoint() + "/systems/1")
	require.NoError(t, err)
	createHost(t, c, ns, "host-1", ep.String(), "", nil)
	op := &metal3sim.Operator{Client: c, Namespace: ns, Interval: 30 * time.Millisecond, Log: slog.New(slog.DiscardHandler),
		Power: func(string) (*bmc.Controller, error) {
			return bmc.New(ep, bmc.NewCredentials("admin", "pw"), bmc.Options{PollInterval: 10 * time.Millisecond, VerifyTimeout: 5 * time.Second, GracefulTimeout: time.Second})
		}}
	go op.Run(ctx)
	h := &clusterapi.Metal3Host{Client: c, Key: client.ObjectKey{Namespace: ns, Name: "host-1"}, Poll: 20 * time.Millisecond, Timeout: 10 * time.Second}
	require.Eventually(t, func() bool { st, _, err := h.Status(ctx); return err == nil && st == bmc.PowerOn }, 5*time.Second, 20*time.Millisecond)
	annotation := func() (string, bool) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
		require.NoError(t, c.Get(ctx, h.Key, u))
		v, ok := u.GetAnnotations()[clusterapi.RebootAnnotation]
		return v, ok
	}

	res, err := h.ForceOff(ctx)
	require.NoError(t, err)
	assert.Equal(t, bmc.PowerOff, res.After)
	assert.Equal(t, "Off", sim.PowerState("1"))
	v, ok := annotation()
	assert.True(t, ok, "a fenced host keeps the annotation")
	assert.JSONEq(t, `{"mode":"hard"}`, v)
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, "Off", sim.PowerState("1"), "kept off while the annotation is there")

	res, err = h.Reboot(ctx)
	require.NoError(t, err)
	assert.Equal(t, bmc.PowerOn, res.After)
	assert.Equal(t, "On", sim.PowerState("1"))
	_, ok = annotation()
	assert.False(t, ok)

	resets := len(sim.Resets("1"))
	_, err = h.PowerCycle(ctx)
	require.NoError(t, err)
	assert.Equal(t, "On", sim.PowerState("1"))
	assert.Contains(t, sim.Resets("1")[resets:], "ForceOff", "mode hard: forced off, no graceful shutdown")

	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
	require.NoError(t, c.Get(ctx, h.Key, u))
	before := u.DeepCopy()
	u.SetAnnotations(map[string]string{clusterapi.HostPausedAnnotation: ""})
	require.NoError(t, c.Patch(ctx, u, client.MergeFrom(before)))
	_, err = h.Reboot(ctx)
	require.EqualError(t, err, "BareMetalHost "+ns+"/host-1 is annotated baremetalhost.metal3.io/paused: its operator does not act on it, so neither does Hale")
}
