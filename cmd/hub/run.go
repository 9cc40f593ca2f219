package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/internal/buildinfo"
	"github.com/hale-dev/hale/internal/cli"
)

// defaultSocket is where `hub run` serves the operator API and the operator commands look for it.
const defaultSocket = "/run/hale/hub.sock"

// nodeSuffix is the length of the random suffix of a hub's default name, hub-HOSTNAME-RANDOM.
const nodeSuffix = 6

type runOptions struct {
	inventory, journal, node, bind, advertise, keyFile string
	identityFile, pinnedFile                           string
	noIdentities                                       bool
	join                                               []string
	api                                                apiListen
	metrics, logLevel                                  string
	keep                                               int
	bmcCheckEvery, bmcRequestTimeout, bmcVerifyTimeout time.Duration
	// kube, when set, runs Kubernetes mode instead of the bbolt journal.
	kube *kubeOptions
}

// apiListen says where the operator API is served: a Unix socket, or loopback TCP with a token.
type apiListen struct {
	socket, address, tokenFile string
}

func newRunCommand() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run --inventory FILE --gossip-key-file FILE --identity-file FILE --pinned-file FILE [--join HOST:PORT,...]",
		Short: "Run the standalone hub: watch the agents, heal machines through their BMCs, serve the operator API",
		Long: `Run the standalone hub. It joins the agents' gossip pool, judges every machine of the inventory,
plans with etcd's quorum and heals through the machines' BMCs, recording every step in a bbolt journal
so that a restarted hub resumes exactly where the last one stopped.

SIGHUP reloads the inventory: a bad file is reported and the previous inventory stays in force.
SIGINT/SIGTERM stop it; remediations in flight stay in the journal and the next hub resumes them.`,
		Example: `  hub run --inventory /etc/hale/inventory.yaml --gossip-key-file /etc/hale/gossip.key \
      --identity-file /var/lib/hale-hub/identity.key --pinned-file /etc/hale/pinned-keys \
      --join 10.0.0.11:7946,10.0.0.12:7946 --journal /var/lib/hale-hub/journal.db
  hub run --kubernetes --discover --enrol --inventory /etc/hale/inventory.yaml --gossip-key-file /etc/hale/gossip/key \
      --identity-file /var/lib/hale/degraded/identity.key --pinned-file /var/lib/hale/degraded/pinned-keys   # as deploy/ runs it`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runHub(ctx, o, cmd.ErrOrStderr(), nil)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.inventory, "inventory", "", "inventory and policy file (YAML; see examples/inventory.yaml) (required)")
	f.StringVar(&o.journal, "journal", "/var/lib/hale-hub/journal.db", "journal file (bbolt); its directory must exist")
	f.StringVar(&o.node, "node", "", "the hub's name in the gossip pool (default: hub-HOSTNAME-RANDOM, new at every start)")
	f.StringVar(&o.bind, "gossip-bind", "0.0.0.0:7947", "gossip address to listen on (UDP and TCP)")
	f.StringVar(&o.advertise, "gossip-advertise", "", "gossip address to advertise, when it differs from the bind address")
	f.StringSliceVar(&o.join, "join", nil, "agents to join (host:port, comma-separated); retried until one answers")
	f.StringVar(&o.keyFile, "gossip-key-file", "", "gossip key file, the agents' (base64 keys, one a line) (required)")
	cli.IdentityFlags(f, &o.identityFile, &o.pinnedFile, "the hub's", "hub-*")
	f.BoolVar(&o.noIdentities, "insecure-no-identities", false, "run without per-node identities (no --identity-file, no --pinned-file): "+identity.IdentitiesOff)
	f.StringVar(&o.api.socket, "socket", defaultSocket, "Unix socket for the operator API (mode 0600; empty: none)")
	f.StringVar(&o.api.address, "api-address", "", "also serve the operator API on this loopback TCP address (needs --api-token-file)")
	f.StringVar(&o.api.tokenFile, "api-token-file", "", "file holding the bearer token for --api-address")
	f.StringVar(&o.metrics, "metrics-address", ":9357", "address for /metrics, /healthz and /readyz (empty: none)")
	cli.LogLevelFlag(f, &o.logLevel)
	f.IntVar(&o.keep, "history", 20, "finished remediations kept per machine in the journal")
	f.DurationVar(&o.bmcCheckEvery, "bmc-check-interval", 10*time.Minute, "how often every machine's BMC is checked (it answers, takes the login, has the system, reads the power; at most one login per BMC account a round); 0: never")
	f.DurationVar(&o.bmcRequestTimeout, "bmc-request-timeout", 10*time.Second, "how long one request to a BMC (Redfish, or one ipmitool call) may take before the BMC is called unreachable (and the request retried)")
	f.DurationVar(&o.bmcVerifyTimeout, "bmc-verify-timeout", 60*time.Second, "how long a power change may take before the BMC is read in the state asked for (servers that take longer to power on need more); a power-on not seen by then is evidence that the machine's power does not come on")
	var k kubeOptions
	var kubernetes bool
	f.BoolVar(&kubernetes, "kubernetes", false, "Kubernetes mode: journal in Remediation objects, leader election, HealthPolicy (instead of --journal)")
	f.StringVar(&k.kubeconfig, "kubeconfig", "", "with --kubernetes: kubeconfig file (default: in-cluster)")
	f.StringVar(&k.namespace, "namespace", "hale-system", "with --kubernetes: namespace of the Lease, Remediations and HealthPolicy")
	f.StringVar(&k.lease, "lease", "hale-hub", "with --kubernetes: the leader-election Lease")
	f.StringVar(&k.policy, "health-policy", "default", "with --kubernetes: the HealthPolicy to follow (empty: none)")
	f.StringVar(&k.capiCluster, "capi-cluster", "", "with --kubernetes: NAMESPACE/NAME of the Cluster API Cluster whose pause pauses Hale (and which an etcd recovery pauses); auto: the Cluster whose Machines the control-plane nodes are")
	f.DurationVar(&k.leaseDuration, "lease-duration", 15*time.Second, "with --kubernetes: how long a dead leader keeps the lease")
	f.BoolVar(&k.discover, "discover", false, "with --kubernetes: find the machines in the cluster (control-plane Nodes, Cluster API Machines, metal3 BareMetalHosts); --inventory then gives the cluster name, the policy and machines with a BMC of their own")
	f.StringVar(&k.machineNamespace, "machine-namespace", "", "with --discover: namespace of the Cluster API Machines and BareMetalHosts (default: all)")
	f.DurationVar(&k.discoverEvery, "discover-interval", 10*time.Second, "with --discover: how often the cluster is read again")
	f.IntVar(&k.agentPort, "agent-port", 7946, "with --discover: the agents' gossip port, joined at every control-plane and witness Node's address (no name to resolve: cluster DNS may be down with the control plane)")
	f.StringVar(&k.gossipService, "gossip-service", "", "with --management: while this replica leads, it is the one endpoint of this Service in --namespace (a Service without a selector, for the workload clusters' agents: a standby would drop their gossip), at its pod's address (environment POD_IP)")
	f.StringVar(&k.degradedJournal, "degraded-journal", "", "with --kubernetes: turns degraded mode on: the local journal (bbolt, on a volume that outlives the container) of a leader that goes on alone when etcd has lost quorum and the API server does not answer (docs/design.md: Quorum lost in Kubernetes mode)")
	f.BoolVar(&k.enrol, "enrol", false, "with --kubernetes: agents and hub replicas enrol their identity keys through the API server (CertificateSigningRequests of signer hale.dev/identity, from their pods' own tokens) and the leader pins them in the ConfigMap "+identity.PinnedConfigMap+"; --identity-file is then this replica's key, --pinned-file its local copy of the pinned keys")
	f.StringSliceVar(&k.agents, "enrol-agents", []string{"hale-agent", "hale-witness"}, "with --enrol, and --management (in each workload cluster): the service accounts (in --namespace) whose requests pin the key of the node their pod runs on")
	f.StringSliceVar(&k.hubs, "enrol-hubs", []string{"hale-hub"}, "with --enrol, and --management (in each workload cluster): the service accounts (in --namespace) whose requests pin a hub replica's key")
	f.StringVar(&k.breakGlass, "break-glass-inventory", "", "with --degraded-journal: inventory of the control-plane machines' BMCs (with credentials files, from a mounted Secret) used only in degraded mode; without it, degraded mode holds every machine")
	f.BoolVar(&k.management, "management", false, "with --kubernetes: heal the control planes of the Cluster API Clusters labelled hale.dev/heal=true, from their management cluster (docs/install.md: In a management cluster); each cell enrols its workload cluster's members in --namespace there, and its key is pinned there (in memory, or --identity-file)")
	f.BoolVar(&k.fallback, "fallback", false, "with --kubernetes, in a workload cluster a management cluster's hub heals: this hub acts only while that hub's cell of the cluster cannot (it takes the Lease once the cell stops renewing it) and hands the Lease back at its next safe checkpoint once the cell wants it (docs/install.md: A fallback in each workload cluster)")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if k.fallback && !kubernetes {
			return errors.New("--fallback needs --kubernetes: the claim it shares with the management cluster's hub is a Lease in this cluster")
		}
		if kubernetes {
			o.kube = &k
		}
		return nil
	}
	return cmd
}

// hubName is the hub's name in the gossip pool: --node, or a new name at every start
// (hub-HOSTNAME-RANDOM): a hub that comes back under its old name from another address conflicts with
// its own ghost in the agents' member lists, and while it does their failure detection slows to
// memberlist's longest suspicion timeout (15-22 s measured, instead of < 1 s).
func hubName(o *runOptions) string {
	if o.node != "" {
		return o.node
	}
	host, _ := os.Hostname()
	return "hub-" + host + "-" + strings.ToLower(rand.Text()[:nodeSuffix])
}

// runAddrs are where a running hub serves: its API listeners (socket path, TCP address) and metrics.
type runAddrs struct {
	API     []string
	Metrics string
}

// runHub runs the standalone hub until ctx ends. ready, when set, receives the addresses once they
// serve.
func runHub(ctx context.Context, o runOptions, stderr io.Writer, ready chan<- runAddrs) error {
	level, err := cli.LogLevel(o.logLevel)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	if o.bmcCheckEvery < 0 || o.bmcRequestTimeout < 0 || o.bmcVerifyTimeout < 0 {
		return fmt.Errorf("--bmc-check-interval %v, --bmc-request-timeout %v, --bmc-verify-timeout %v: none may be negative",
			o.bmcCheckEvery, o.bmcRequestTimeout, o.bmcVerifyTimeout)
	}
	if o.kube != nil && o.kube.management {
		if o.kube.fallback {
			return errors.New("--fallback is for a workload cluster's own hub; the management cluster's hub (--management) is the one it falls back from")
		}
		return runManagement(ctx, o, log, ready)
	}
	if o.kube != nil && o.kube.gossipService != "" {
		return errors.New("--gossip-service is for --management (the Service of the workload clusters' agents); a hub that heals its own cluster is reached at its pod")
	}
	if o.inventory == "" || o.keyFile == "" {
		return errors.New("--inventory and --gossip-key-file are required")
	}
	if o.kube != nil && o.kube.enrol {
		if err := checkEnrol(o); err != nil {
			return err
		}
	} else if err := identity.CheckIdentitySettings(o.identityFile, o.pinnedFile, o.noIdentities, "--insecure-no-identities"); err != nil {
		return err
	}
	pinAs := o.node
	if o.node == "" {
		pinAs = "hub-*"
	}
	o.node = hubName(&o)
	discover := o.kube != nil && o.kube.discover
	inventory, err := inventory.NewReloader(o.inventory, !discover)
	if err != nil {
		return err
	}
	keys, err := health.LoadGossipKeys(o.keyFile)
	if err != nil {
		return err
	}
	gc := health.GossipConfig{Node: o.node, Cluster: inventory.Current().Cluster, Role: "hub", Keys: keys, Logger: log, Timing: health.DefaultTiming()}
	// The hub's name is new at every start: its key is pinned for every name it may take (hub-*).
	var enrol *identity.Enrolment
	if o.kube != nil && o.kube.enrol {
		if enrol, err = o.kube.enrolment(o, log); err != nil {
			return err
		}
		gc.Identity, gc.Pinned = &enrol.Identity, enrol.Start()
	} else if gc.Identity, gc.Pinned, err = identity.LoadIdentities(o.node, pinAs, o.identityFile, o.pinnedFile, o.noIdentities, "--insecure-no-identities", log); err != nil {
		return err
	}
	if gc.BindAddr, gc.BindPort, err = splitHostPort("--gossip-bind", o.bind); err != nil {
		return err
	}
	if o.advertise != "" {
		if gc.AdvertiseAddr, gc.AdvertisePort, err = splitHostPort("--gossip-advertise", o.advertise); err != nil {
			return err
		}
	}
	apiLns, err := listenAPI(o.api)
	if err != nil {
		return err
	}
	defer closeAPI(apiLns, o.api)
	var standalone *boltfile.File
	if o.kube == nil {
		if standalone, err = boltfile.Open(o.journal, o.keep); err != nil {
			return err
		}
		defer standalone.Close()
	}
	g, err := health.StartGossip(gc)
	if err != nil {
		return err
	}
	defer func() {
		if err := g.Leave(2 * time.Second); err != nil {
			log.Warn("leaving the gossip pool", "err", err)
		}
		_ = g.Shutdown()
	}()
	if peers := joinPeers(ctx, o, log); peers != nil {
		go g.JoinLoop(ctx, peers)
	}
	go g.WatchKeyFile(ctx, o.keyFile, health.KeyFileCheck) // a rotation, as the agents do
	switch {
	case enrol != nil:
		go enrol.Run(ctx, g.SetPinned)
	case gc.Pinned != nil:
		go g.WatchPinnedFile(ctx, o.pinnedFile, health.KeyFileCheck)
	}

	base := prometheus.NewRegistry()
	base.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		health.NewGossipCollector(g, "hale_hub"))
	bmcMetrics, err := bmc.NewMetrics(base)
	if err != nil {
		return err
	}
	// The hub in charge: one for the process standalone; in Kubernetes mode, one per leadership term
	// (none while another replica leads), each with its own registry for its metrics.
	var current atomic.Pointer[term]
	base.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "hale_hub_leading",
		Help: "1 while this hub is the one in charge (standalone; the Lease's leader, or degraded mode's), 0 on a standby replica."},
		func() float64 {
			if current.Load() != nil {
				return 1
			}
			return 0
		}))
	newHub := func(store journal.Store, adjust func(*hub.Config)) (*hub.Hub, error) {
		reg := prometheus.NewRegistry()
		cfg := hub.Config{Inventory: inventory.Current(), Gossip: g, Journal: store, Log: log, Metrics: reg,
			BMC: bmc.Options{Metrics: bmcMetrics, Logger: log, RequestTimeout: o.bmcRequestTimeout, VerifyTimeout: o.bmcVerifyTimeout}, BMCCheckInterval: o.bmcCheckEvery}
		if o.bmcCheckEvery == 0 {
			cfg.BMCCheckInterval = -1 // never
		}
		if adjust != nil {
			adjust(&cfg)
		}
		h, err := hub.New(cfg)
		if err == nil {
			current.Store(&term{hub: h, reg: reg})
		}
		return h, err
	}

	var servers []*http.Server
	defer func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}()
	// Kubernetes mode: the API server's client, and who leads when this replica does not (the Lease's
	// holder), for a standby's answer to an operator.
	var kc kubeClient
	var leads func(context.Context) string
	if o.kube != nil {
		if kc.c, kc.cfg, err = o.kube.kubeClient(); err != nil {
			return err
		}
		leads = func(ctx context.Context) string { return standbyAnswer(ctx, kc.c, o.kube.namespace, o.kube.lease) }
	}
	var addrs runAddrs
	for _, l := range apiLns {
		servers = append(servers, serveHTTP(l.ln, termHandler(&current, leads, l.token)))
		addrs.API = append(addrs.API, l.ln.Addr().String())
	}
	if o.metrics != "" {
		s, addr, err := listenMetrics(o.metrics, func(mux *http.ServeMux) { routeMetrics(mux, base, &current) })
		if err != nil {
			return err
		}
		servers = append(servers, s)
		addrs.Metrics = addr
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := inventory.Reload(); err != nil {
					log.Error("inventory reload failed", "err", err)
					continue
				}
				if t := current.Load(); t != nil && !discover { // discovery picks up the file's changes at its next pass
					if err := t.hub.SetInventory(inventory.Current()); err != nil {
						log.Error("inventory reload refused", "err", err)
					}
				}
			}
		}
	}()
	log.Info("hub started", "version", buildinfo.Get().String(), "node", o.node, "cluster", gc.Cluster, "gossip", g.Addr(), "api", addrs.API, "metrics", addrs.Metrics,
		"machines", len(inventory.Current().Machines), "kubernetes", o.kube != nil)
	if ready != nil {
		ready <- addrs
	}
	if o.kube != nil {
		err = runLeading(ctx, o, kc, log, inventory, newHub, &current)
	} else {
		var h *hub.Hub
		if h, err = newHub(standalone, func(cfg *hub.Config) { cfg.Standby = hub.FirstHubLeads(g, o.node) }); err == nil {
			log.Info("journal", "path", o.journal, "epoch", standalone.Epoch())
			err = h.Run(ctx)
		}
	}
	log.Info("hub stopped")
	return err
}

// routeMetrics routes /metrics (base's and the hub in charge's), /healthz and /readyz.
func routeMetrics(mux *http.ServeMux, base *prometheus.Registry, current *atomic.Pointer[term]) {
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		gatherers := prometheus.Gatherers{base}
		if t := current.Load(); t != nil {
			gatherers = append(gatherers, t.reg)
		}
		promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		// A standby replica is healthy; the hub in charge is when its pipeline runs.
		if t := current.Load(); t != nil {
			if why := t.hub.Stalled(time.Now(), 2*time.Minute, 30*time.Second); why != "" {
				http.Error(w, why, http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		t := current.Load()
		if t == nil {
			http.Error(w, "standing by: another replica leads", http.StatusServiceUnavailable)
			return
		}
		if why := t.hub.Status(r.Context()).NotPlanning; why != "" {
			http.Error(w, "not planning: "+why, http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
}

// listenMetrics listens on --metrics-address and serves the routes routes sets.
func listenMetrics(addr string, routes func(*http.ServeMux)) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("--metrics-address %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	routes(mux)
	return serveHTTP(ln, mux), ln.Addr().String(), nil
}

// serveHTTP serves h on ln until the server it returns is closed.
func serveHTTP(ln net.Listener, h http.Handler) *http.Server {
	s := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.Serve(ln) }()
	return s
}
