package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/netns"
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
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("lab: a forwarder to %s's etcd: %v", m.Name, err)
		}
		member := m.Host.Addr(2379)
		forward(t, ln, func(ctx context.Context) (net.Conn, error) { return host.Dial(ctx, "tcp", member) })
		a.etcd[m] = "http://" + ln.Addr().String()
	}
	a.Client, a.Config, a.env = kubeenv.StartOnEtcd(t, a.endpoints(machines))
	ln, err := host.Listen("tcp", host.Addr(6443))
	if err != nil {
		t.Fatalf("lab: the API server's listener on %s: %v", host.Name, err)
	}
	u, err := url.Parse(a.Config.Host)
	if err != nil {
		t.Fatalf("lab: the API server's address: %v", err)
	}
	local := u.Host
	forward(t, ln, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", local)
	})
	inLab := rest.CopyConfig(a.Config)
	inLab.Host = "https://" + host.Addr(6443)
	inLab.ServerName = "localhost" // its serving certificate's name (test/kubeenv's)
	a.Kubeconfig = kubeenv.Kubeconfig(t, inLab, c.Dir, "")
	return a
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

// forward accepts connections on ln until t ends, and joins each to one that dial makes.
func forward(t testing.TB, ln net.Listener, dial func(context.Context) (net.Conn, error)) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer in.Close()
				out, err := dial(ctx)
				if err != nil {
					return
				}
				// Either side's end (or the test's) ends both: a peer that closes is gone.
				stop := context.AfterFunc(ctx, func() { in.Close(); out.Close() })
				defer stop()
				done := make(chan struct{})
				go func() {
					defer close(done)
					_, _ = io.Copy(out, in)
					in.Close()
					out.Close()
				}()
				_, _ = io.Copy(in, out)
				in.Close()
				out.Close()
				<-done
			})
		}
	})
}
