package lab

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/netns"
	"github.com/hale-dev/hale/test/silent"
)

// APIServer is a real kube-apiserver (test/kubeenv's, with Hale's CRDs) whose storage is the lab's
// etcd. Its process runs outside the lab, but it is on the lab's network as a process of its host
// would be: its connections to the members leave from that host (a forwarder per member, dialling
// from there), and the lab's processes reach it at the host's address, port 6443 (a forwarder
// listening there). A partition or an iptables rule on its host applies to it.
type APIServer struct {
	// Client and Config reach it from the test process.
	Client client.Client
	Config *rest.Config
	// Kubeconfig is an admin kubeconfig for the lab's processes: the server at Host's address.
	Kubeconfig string
	Host       *netns.Host
	env        *envtest.Environment
	// etcd is each machine's member as the API server reaches it (a forwarder's URL).
	etcd map[*Machine]string
}

// StartAPIServer starts an API server on host (a host of the lab's, such as one added for it) whose
// storage is the etcd members of machines; it stops when t ends.
func (c *Cluster) StartAPIServer(t testing.TB, host *netns.Host, machines ...*Machine) *APIServer {
	t.Helper()
	a := &APIServer{Host: host, etcd: map[*Machine]string{}}
	for _, m := range c.Machines {
		a.etcd[m] = "http://" + Reach(t, host, m.Host.Addr(2379))
	}
	a.Client, a.Config, a.env = kubeenv.StartOnEtcd(t, a.endpoints(machines))
	a.Kubeconfig = Expose(t, host, a.Config, c.Dir, "")
	return a
}

// Reach is an address on this process's loopback (a forwarder listening there) at which its own
// clients reach addr, a TCP address on the lab's network, as from host: its connections leave from
// there.
func Reach(t testing.TB, host *netns.Host, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("lab: a forwarder to %s from %s: %v", addr, host.Name, err)
	}
	silent.Join(t, ln, func(ctx context.Context) (net.Conn, error) { return host.Dial(ctx, "tcp", addr) }, nil)
	return ln.Addr().String()
}

// Expose puts the API server cfg reaches (one of this process's, such as test/kubeenv's) on the lab's
// network at host's address, port 6443 (a forwarder listening there), and writes a kubeconfig for the
// lab's processes into dir: the server at that address, acting as user (impersonated, with groups)
// when user is not empty.
func Expose(t testing.TB, host *netns.Host, cfg *rest.Config, dir, user string, groups ...string) string {
	t.Helper()
	ln, err := host.Listen("tcp", host.Addr(6443))
	if err != nil {
		t.Fatalf("lab: the API server's listener on %s: %v", host.Name, err)
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatalf("lab: the API server's address: %v", err)
	}
	local := u.Host
	silent.Join(t, ln, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", local)
	}, nil)
	return Kubeconfig(t, host, cfg, dir, user, groups...)
}

// Kubeconfig writes a kubeconfig into dir for the lab's processes to reach the API server Expose put
// on host, acting as user (impersonated, with groups) when user is not empty.
func Kubeconfig(t testing.TB, host *netns.Host, cfg *rest.Config, dir, user string, groups ...string) string {
	t.Helper()
	inLab := rest.CopyConfig(cfg)
	inLab.Host = "https://" + host.Addr(6443)
	inLab.ServerName = "localhost" // its serving certificate's name (test/kubeenv's)
	return kubeenv.Kubeconfig(t, inLab, dir, user, groups...)
}

// endpoints are the etcd servers of machines, as the API server reaches them.
func (a *APIServer) endpoints(machines []*Machine) []string {
	var out []string
	for _, m := range machines {
		out = append(out, a.etcd[m])
	}
	return out
}

// RestartOn restarts the API server with the etcd members of machines as its storage (as kubeadm's
// after an etcd recovery: its own machine's member).
func (a *APIServer) RestartOn(machines ...*Machine) error {
	api := a.env.ControlPlane.APIServer
	if err := api.Stop(); err != nil {
		return fmt.Errorf("stopping the API server: %w", err)
	}
	api.Configure().Set("etcd-servers", strings.Join(a.endpoints(machines), ","))
	if err := api.Start(); err != nil {
		return fmt.Errorf("starting the API server again: %w", err)
	}
	return nil
}
