package cells

import (
	"context"
	"fmt"
	"net"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// EndpointManagedBy marks the EndpointSlice a LeaderEndpoint writes as Hale's, not the endpoint
// controller's.
const EndpointManagedBy = "hale.dev"

// LeaderEndpoint makes the leading replica the one endpoint of a Service without a selector: the
// management hub's gossip Service, whose traffic only the leader (the replica running the cells) can
// take; a standby would drop it. The leader writes it when it starts to lead, so a new leader takes
// the Service over from a dead one.
type LeaderEndpoint struct {
	Client   client.Client
	Service  client.ObjectKey
	Address  string // this replica's pod address
	Port     int32
	TCP, UDP string // the Service's port names
	NodeName string // where the pod runs (for the slice's topology; may be empty)
}

// Claim points the Service at this replica, creating its EndpointSlice or replacing what it holds
// (unless it holds this replica already).
func (e *LeaderEndpoint) Claim(ctx context.Context) error {
	ip := net.ParseIP(e.Address)
	if ip == nil {
		return fmt.Errorf("the gossip Service %s's endpoint: %q is not an IP address (POD_IP)", e.Service, e.Address)
	}
	family := discoveryv1.AddressTypeIPv4
	if ip.To4() == nil {
		family = discoveryv1.AddressTypeIPv6
	}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	ready := true
	ep := discoveryv1.Endpoint{Addresses: []string{e.Address}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
	if e.NodeName != "" {
		ep.NodeName = &e.NodeName
	}
	want := discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.Service.Namespace, Name: e.Service.Name, Labels: map[string]string{
			discoveryv1.LabelServiceName: e.Service.Name, discoveryv1.LabelManagedBy: EndpointManagedBy}},
		AddressType: family,
		Endpoints:   []discoveryv1.Endpoint{ep},
		Ports:       []discoveryv1.EndpointPort{{Name: &e.TCP, Protocol: &tcp, Port: &e.Port}, {Name: &e.UDP, Protocol: &udp, Port: &e.Port}},
	}
	var have discoveryv1.EndpointSlice
	err := e.Client.Get(ctx, client.ObjectKeyFromObject(&want), &have)
	switch {
	case apierrors.IsNotFound(err):
		err = e.Client.Create(ctx, &want)
	case err == nil && endpointsOf(&have) == endpointsOf(&want) && have.Labels[discoveryv1.LabelManagedBy] == EndpointManagedBy:
		return nil // written only on change
	case err == nil:
		have.Labels, have.AddressType, have.Endpoints, have.Ports = want.Labels, want.AddressType, want.Endpoints, want.Ports
		err = e.Client.Update(ctx, &have)
	}
	if err != nil {
		return fmt.Errorf("pointing the gossip Service %s at this replica (EndpointSlice %s): %w", e.Service, e.Service, err)
	}
	return nil
}

// endpointsOf says what a slice points at (its addresses, nodes and ports), whatever the API server
// defaulted in it.
func endpointsOf(s *discoveryv1.EndpointSlice) string {
	var b strings.Builder
	for _, e := range s.Endpoints {
		fmt.Fprintf(&b, "%v@%s ", e.Addresses, valueOr(e.NodeName, ""))
	}
	for _, p := range s.Ports {
		fmt.Fprintf(&b, "%s/%s/%d ", valueOr(p.Name, ""), valueOr(p.Protocol, ""), valueOr(p.Port, 0))
	}
	return b.String()
}

// valueOr is *p, or or when p is nil.
func valueOr[T any](p *T, or T) T {
	if p == nil {
		return or
	}
	return *p
}
