package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/kube/cells"
)

// The leading replica makes itself the gossip Service's one endpoint: created, left alone while it
// holds (no write: the management cluster is written only on change), taken over by the next leader;
// an address that is not an IP is refused with the variable named.
func TestLeaderEndpoint(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	svc := client.ObjectKey{Namespace: ns, Name: "hale-hub-gossip"}
	e := &cells.LeaderEndpoint{Client: c, Service: svc, Address: "10.244.0.7", NodeName: "node-a", Port: 7947, TCP: "gossip-tcp", UDP: "gossip-udp"}
	require.NoError(t, e.Claim(ctx))
	var slice discoveryv1.EndpointSlice
	require.NoError(t, c.Get(ctx, svc, &slice))
	assert.Equal(t, "hale-hub-gossip", slice.Labels[discoveryv1.LabelServiceName])
	assert.Equal(t, cells.EndpointManagedBy, slice.Labels[discoveryv1.LabelManagedBy])
	require.Len(t, slice.Endpoints, 1)
	assert.Equal(t, []string{"10.244.0.7"}, slice.Endpoints[0].Addresses)
	assert.Equal(t, "node-a", *slice.Endpoints[0].NodeName)
	require.Len(t, slice.Ports, 2)
	version := slice.ResourceVersion

	require.NoError(t, e.Claim(ctx))
	require.NoError(t, c.Get(ctx, svc, &slice))
	assert.Equal(t, version, slice.ResourceVersion, "held already: not written again")

	next := *e
	next.Address, next.NodeName = "10.244.1.9", "node-b"
	require.NoError(t, next.Claim(ctx))
	require.NoError(t, c.Get(ctx, svc, &slice))
	assert.Equal(t, []string{"10.244.1.9"}, slice.Endpoints[0].Addresses, "the next leader's")

	bad := *e
	bad.Address = ""
	assert.ErrorContains(t, bad.Claim(ctx), `the gossip Service `+svc.String()+`'s endpoint: "" is not an IP address (POD_IP)`)
}
