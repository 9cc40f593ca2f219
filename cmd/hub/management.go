package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/health/gossipmux"
	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/internal/buildinfo"
	"github.com/hale-dev/hale/kube"
	"github.com/hale-dev/hale/kube/cellhub"
	"github.com/hale-dev/hale/kube/cells"
	"github.com/hale-dev/hale/kube/lists"
)

// management is `hub run --kubernetes --management` (docs/design.md, Management mode; docs/install.md,
// In a management cluster): the hub in a Cluster API management cluster. The replicas elect one
// leader, which runs one cell per Cluster labelled hale.dev/heal=true (kube/cells): each a hub of its
// own, its gossip pool on the one shared gossip port (health/gossipmux), its machines found across
// the management cluster (Cluster API's and metal3's objects) and its workload cluster (Nodes), its
// journal, requests and HealthPolicy (named after the Cluster) in the Cluster's namespace, its
// identities enrolled in its workload cluster.
type management struct {
	o      runOptions
	c      client.Client
	runner cellhub.Runner // each cell's run
	log    *slog.Logger

	mu   sync.Mutex
	regs map[client.ObjectKey]*prometheus.Registry // each running cell's metrics
	hubs map[client.ObjectKey]*hub.Hub             // each running cell's hub, for the operator API
	set  *cells.Set                                // while this replica leads
}

// runManagement runs management mode until ctx ends; ready, when set, receives the addresses once
// they serve.
func runManagement(ctx context.Context, o runOptions, log *slog.Logger, ready chan<- runAddrs) error {
	k := o.kube
	switch {
	case k.discover || k.enrol || k.degradedJournal != "" || k.capiCluster != "":
		return errors.New("--management finds each Cluster's machines itself: without --discover, --enrol, --degraded-journal or --capi-cluster")
	case o.inventory != "" || o.keyFile != "":
		return errors.New("--management takes each Cluster's policy from its HealthPolicy and its gossip keys from its Secret: without --inventory or --gossip-key-file")
	case k.gossipService != "" && net.ParseIP(os.Getenv("POD_IP")) == nil:
		return fmt.Errorf("--gossip-service %s: this replica's pod address must be in the environment variable POD_IP (the downward API's status.podIP, as deploy/management sets it), not %q",
			k.gossipService, os.Getenv("POD_IP"))
	case o.pinnedFile != "":
		return fmt.Errorf("--management reads each workload cluster's pinned keys (ConfigMap %s in its namespace %s) and pins its own key there: without --pinned-file",
			identity.PinnedConfigMap, k.namespace)
	}
	m := &management{o: o, log: log, regs: map[client.ObjectKey]*prometheus.Registry{}, hubs: map[client.ObjectKey]*hub.Hub{}}
	r := &m.runner
	var err error
	if r.Policy, err = (inventory.PolicyFile{}).Validate(); err != nil {
		return err
	}
	// Only the leader runs cells, and each pins its key in its workload cluster as the one management
	// hub's (replacing the last leader's): not as hub-POD-*, which that cluster's own enrolment would
	// unpin, finding no such pod there.
	r.Node, r.PinAs = cmp.Or(o.node, "management-"+hubName(&o)), cmp.Or(o.node, "management-hub-*")
	node := r.Node
	if !o.noIdentities {
		id := identity.NewIdentity() // pinned anew by each cell it runs
		if o.identityFile != "" {
			if id, _, err = identity.LoadOrCreateIdentity(o.identityFile); err != nil {
				return err
			}
		}
		r.Identity = &id
	}
	bindAddr, bindPort, err := splitHostPort("--gossip-bind", o.bind)
	if err != nil {
		return err
	}
	if o.advertise != "" {
		if r.AdvertiseAddr, r.AdvertisePort, err = splitHostPort("--gossip-advertise", o.advertise); err != nil {
			return err
		}
	}
	base, err := health.NewTransport(bindAddr, bindPort, log)
	if err != nil {
		return err
	}
	r.Mux = gossipmux.New(base, log)
	defer func() { _ = r.Mux.Shutdown() }()
	c, cfg, err := k.kubeClient()
	if err != nil {
		return err
	}
	m.c, r.Client = c, c
	// Every cell polls its requests and reads its HealthPolicy and Cluster each second: from one
	// informer cache of the management cluster, not a request per cell (lists.Shared; a request it
	// acts on it reads again live, and its own writes it reads back no older than written).
	if r.Lists, err = lists.New(ctx, k.clientConfig(cfg), c.Scheme(), c, log); err != nil {
		return err
	}
	promBase := prometheus.NewRegistry()
	promBase.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if r.BMC.Metrics, err = bmc.NewMetrics(promBase); err != nil {
		return err
	}
	r.BMC.Logger, r.BMC.RequestTimeout, r.BMC.VerifyTimeout = log, o.bmcRequestTimeout, o.bmcVerifyTimeout
	r.BMCCheckEvery, r.Keep, r.Namespace, r.Agents, r.Hubs = o.bmcCheckEvery, o.keep, k.namespace, k.agents, k.hubs
	r.AgentPort, r.DiscoverEvery, r.Log, r.Running = k.agentPort, k.discoverEvery, log, m.running
	// Each workload cluster's claim has the management Lease's timing: a cell gone with the management
	// cluster is taken over by that cluster's fallback hub one lease duration after its last renewal.
	timing := leaseTiming(k.leaseDuration)
	r.Claim = timing
	addrs := runAddrs{}
	apiLns, err := listenAPI(o.api)
	if err != nil {
		return err
	}
	defer closeAPI(apiLns, o.api)
	leads := func(ctx context.Context) string { return standbyAnswer(ctx, m.c, k.namespace, k.lease) }
	for _, l := range apiLns {
		s := serveHTTP(l.ln, hub.RequireToken(l.token, m.api(leads)))
		defer s.Close()
		addrs.API = append(addrs.API, l.ln.Addr().String())
	}
	if o.metrics != "" {
		// /healthz says the process serves: a stalled cell is its own (its status says so), and a
		// restart of the pod would stop every cell.
		s, addr, err := listenMetrics(o.metrics, func(mux *http.ServeMux) {
			mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
				promhttp.HandlerFor(append(prometheus.Gatherers{promBase}, m.gatherers()...), promhttp.HandlerOpts{}).ServeHTTP(w, r)
			})
			mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		})
		if err != nil {
			return err
		}
		defer s.Close()
		addrs.Metrics = addr
	}
	log.Info("hub started (management mode)", "version", buildinfo.Get().String(), "node", node, "gossip", net.JoinHostPort(bindAddr, fmt.Sprint(base.Port())),
		"metrics", addrs.Metrics)
	if ready != nil {
		ready <- addrs
	}
	return kube.Elect(ctx, cfg, m.c, k.namespace, k.lease, node, timing, func(lctx context.Context, leader *kube.Leader) {
		log.Info("leading", "lease", k.namespace+"/"+k.lease, "epoch", leader.Epoch())
		if k.gossipService != "" {
			go m.claimGossipService(lctx, base.Port())
		}
		set := &cells.Set{Client: m.c, Log: log, Run: func(ctx context.Context, cell cells.Cell) error { return r.Run(ctx, leader, cell) }}
		m.mu.Lock()
		m.set = set
		m.mu.Unlock()
		set.Loop(lctx, k.discoverEvery)
		m.mu.Lock()
		m.set = nil
		m.mu.Unlock()
		log.Info("no longer leading", "epoch", leader.Epoch())
	}, nil)
}

// claimGossipService makes this replica, while it leads (until ctx ends), the one endpoint of the
// gossip Service (--gossip-service), checked every 10 s: the agents' gossip must reach the replica
// that runs their cells.
func (m *management) claimGossipService(ctx context.Context, port int) {
	e := &cells.LeaderEndpoint{Client: m.c, Service: client.ObjectKey{Namespace: m.o.kube.namespace, Name: m.o.kube.gossipService},
		Address: os.Getenv("POD_IP"), NodeName: os.Getenv("NODE_NAME"), Port: int32(port), TCP: "gossip-tcp", UDP: "gossip-udp"}
	var said string
	for {
		if err := e.Claim(ctx); err != nil && ctx.Err() == nil && err.Error() != said {
			m.log.Error("the workload clusters' agents may not reach this replica", "err", err)
			said = err.Error()
		} else if err == nil && said != "" {
			m.log.Info("the gossip Service points at this replica", "service", e.Service.String(), "address", e.Address)
			said = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Second):
		}
	}
}

// api is the operator API of management mode: each running cell's hub under
// /clusters/NAMESPACE/NAME/ (the operator commands' --cluster); anything else is answered with the
// Clusters to choose from (or, on a replica that does not lead, with the one that does).
func (m *management) api(leads func(context.Context) string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/clusters/{namespace}/{name}/", func(w http.ResponseWriter, r *http.Request) {
		key := client.ObjectKey{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
		m.mu.Lock()
		h, leading := m.hubs[key], m.set != nil
		m.mu.Unlock()
		switch {
		case !leading:
			hub.WriteAPIError(w, http.StatusServiceUnavailable, leads(r.Context()))
		case h == nil:
			hub.WriteAPIError(w, http.StatusNotFound, fmt.Sprintf("no cell of Cluster API Cluster %s runs here: %s", key, m.cellList()))
		default:
			http.StripPrefix("/clusters/"+key.Namespace+"/"+key.Name, h.APIHandler("")).ServeHTTP(w, r)
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		leading := m.set != nil
		m.mu.Unlock()
		if !leading {
			hub.WriteAPIError(w, http.StatusServiceUnavailable, leads(r.Context()))
			return
		}
		hub.WriteAPIError(w, http.StatusBadRequest, "this hub heals the control planes of several clusters (management mode): "+
			"name one with --cluster NAMESPACE/NAME; "+m.cellList())
	})
	return mux
}

// cellList says which Clusters have a cell, and why the others' do not run.
func (m *management) cellList() string {
	m.mu.Lock()
	set := m.set
	m.mu.Unlock()
	var list []string
	if set != nil {
		for _, st := range set.Status() {
			switch {
			case st.Running && st.Problem == "":
				list = append(list, st.Cluster.String()+" (running)")
			case st.Running:
				list = append(list, fmt.Sprintf("%s (running; %s)", st.Cluster, st.Problem))
			default:
				list = append(list, fmt.Sprintf("%s (not running: %s)", st.Cluster, st.Problem))
			}
		}
	}
	if len(list) == 0 {
		return "no Cluster API Cluster is labelled " + cells.OptInLabel + "=true (or none was found yet)"
	}
	return "the Clusters labelled " + cells.OptInLabel + "=true are " + strings.Join(list, ", ")
}

// gatherers are the running cells' registries.
func (m *management) gatherers() []prometheus.Gatherer {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []prometheus.Gatherer
	for _, key := range slices.SortedFunc(maps.Keys(m.regs), func(a, b client.ObjectKey) int { return cmp.Compare(a.String(), b.String()) }) {
		out = append(out, m.regs[key])
	}
	return out
}

// running keeps a running cell's hub and metrics for the operator API and /metrics, until it stops.
func (m *management) running(key client.ObjectKey, h *hub.Hub, reg *prometheus.Registry) func() {
	m.mu.Lock()
	m.regs[key], m.hubs[key] = reg, h
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		delete(m.regs, key)
		delete(m.hubs, key)
		m.mu.Unlock()
	}
}
