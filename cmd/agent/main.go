// Command agent runs on every control-plane node: it probes the node, reads etcd membership from the
// local member, and gossips a versioned report to its peers over encrypted memberlist. It never acts.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/internal/buildinfo"
	"github.com/hale-dev/hale/internal/cli"
)

func main() {
	// The agent is light but wakes often (gossip probes every 100 ms): with more than one P the Go
	// scheduler spins idle threads looking for work, which measurably costs more than the work itself
	// (5 idle agents: ~0.67 % of a core each at 2 Ps, ~0.55 % at 1). GOMAXPROCS in the environment wins.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

// run runs the agent's command line until ctx ends. ready, when set, receives the address of the
// HTTP endpoint once everything is up (tests use it).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready chan<- string) error {
	root := newRootCommand(stdout, stderr, ready)
	root.SetArgs(compatArgs(root, args))
	return root.ExecuteContext(ctx)
}

// agentFlags are the agent's flags; each one set overrides the config file.
type agentFlags struct {
	config, node, cluster, role, bind, join, keyFile, identityFile, pinnedFile, listen, logLevel string
	printIdentity                                                                                bool
}

func newRootCommand(stdout, stderr io.Writer, ready chan<- string) *cobra.Command {
	var f agentFlags
	root := &cobra.Command{
		Use:   "agent --config FILE",
		Short: "Hale's agent: probes this node, reads etcd's membership, gossips its report to its peers; it never acts",
		Long: `agent runs on every control-plane node (a DaemonSet, or a systemd unit) and on witness hosts. It
probes the node (kubelet, API server, etcd, disk, clock), reads the etcd membership from the local
member, and gossips a signed, versioned report to its peers and the hub over encrypted memberlist.
It never acts on anything.

The configuration file is YAML (docs/reference/agent.md); each flag set here overrides it. Flags are
written --name (the older -name spelling is still accepted).`,
		Example: `  agent --config /etc/hale/agent.yaml                  # as the DaemonSet and the systemd unit run it
  agent --config /etc/hale/agent.yaml --log-level debug
  agent --print-identity --identity-file /var/lib/hale/identity.key   # this node's line for the pinned-keys file`,
		Version:       buildinfo.Get().String(),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runWithFlags(cmd.Context(), f, stdout, stderr, ready)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("agent {{.Version}}\n")
	fl := root.Flags()
	fl.StringVar(&f.config, "config", "", "YAML config file (the flags below override it)")
	fl.StringVar(&f.node, "node", "", "this node's name in the pool (default: host name)")
	fl.StringVar(&f.cluster, "cluster", "", "the pool's name, the same on every node of a cluster")
	fl.StringVar(&f.role, "role", "", "agent (a control-plane node, the default) or witness (another host that observes and votes)")
	fl.StringVar(&f.bind, "bind", "", "gossip host:port (default 0.0.0.0:7946)")
	fl.StringVar(&f.join, "join", "", "comma-separated host:port of peers to join")
	fl.StringVar(&f.keyFile, "key-file", "", "gossip key file (base64 keys, one a line)")
	cli.IdentityFlags(fl, &f.identityFile, &f.pinnedFile, "this node's", "its node name")
	fl.BoolVar(&f.printIdentity, "print-identity", false, "print this node's line for the pinned-keys file (creating its key when missing) and exit")
	fl.StringVar(&f.listen, "listen", "", "host:port for /healthz, /readyz and /metrics (default 127.0.0.1:9101)")
	cli.LogLevelFlag(fl, &f.logLevel)
	root.AddCommand(cli.VersionCommand("agent"), newRecoverCommand(stdout, stderr), newRejoinCommand(stdout, stderr))
	return root
}

// compatArgs accepts the agent's older flag spelling, Go's flag package's -name and -name=value, for
// the long flags root knows: configurations and unit files written for it keep working.
func compatArgs(root *cobra.Command, args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && len(name) > 1 && root.Flags().Lookup(name) != nil {
			a = "-" + a
		}
		if a == "-version" || a == "-help" { // cobra adds these flags when it runs
			a = "-" + a
		}
		out = append(out, a)
	}
	return out
}

// runWithFlags reads the config, lays the flags over it and runs the agent (or prints its identity).
func runWithFlags(ctx context.Context, f agentFlags, stdout, stderr io.Writer, ready chan<- string) error {
	level, err := cli.LogLevel(f.logLevel)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	cfg, err := loadConfig(f.config)
	if err != nil {
		return err
	}
	for _, o := range []struct {
		flag string
		dst  *string
	}{{f.node, &cfg.Node}, {f.cluster, &cfg.Cluster}, {f.role, &cfg.Role}, {f.bind, &cfg.Gossip.Bind}, {f.keyFile, &cfg.Gossip.KeyFile},
		{f.identityFile, &cfg.Gossip.IdentityFile}, {f.pinnedFile, &cfg.Gossip.PinnedFile}, {f.listen, &cfg.Listen}} {
		if o.flag != "" {
			*o.dst = o.flag
		}
	}
	if f.join != "" {
		cfg.Gossip.Join = strings.Split(f.join, ",")
	}
	if cfg.Role == RoleWitness && len(cfg.Probes) > 0 {
		// Before the defaults fill every section in: a section written for a witness, enabled or
		// not, says someone expects it to probe.
		return errors.New("probes: a witness runs none (it is not a machine Hale heals); remove the probes section or set role: agent")
	}
	cfg = cfg.withDefaults()
	if f.printIdentity {
		if cfg.Gossip.IdentityFile == "" {
			return errors.New("--print-identity: no identity file (gossip.identityFile or --identity-file)")
		}
		id, _, err := identity.LoadOrCreateIdentity(cfg.Gossip.IdentityFile)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, cfg.Node, id.Public())
		return nil
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	log.Info("agent starting", "version", buildinfo.Get().String())
	return runAgent(ctx, cfg, log, ready)
}

func runAgent(ctx context.Context, cfg Config, log *slog.Logger, ready chan<- string) error {
	keys, err := health.LoadGossipKeys(cfg.Gossip.KeyFile)
	if err != nil {
		return err
	}
	bindHost, bindPort, _ := splitHostPort(cfg.Gossip.Bind)
	gc := health.GossipConfig{Node: cfg.Node, Cluster: cfg.Cluster, Role: cfg.Role, BindAddr: bindHost, BindPort: bindPort,
		Keys: keys, Logger: log, Timing: health.DefaultTiming()}
	var enrol *identity.Enrolment
	if cfg.Gossip.Enrol == EnrolKubernetes {
		if enrol, err = enrolment(cfg, log); err != nil {
			return err
		}
		gc.Identity, gc.Pinned = &enrol.Identity, enrol.Start()
	} else if gc.Identity, gc.Pinned, err = identity.LoadIdentities(cfg.Node, cfg.Node, cfg.Gossip.IdentityFile, cfg.Gossip.PinnedFile,
		cfg.Gossip.InsecureNoIdentities, "gossip.insecureNoIdentities: true", log); err != nil {
		return err
	}
	gc.Timing.ProbeInterval, gc.Timing.ProbeTimeout = cfg.Gossip.ProbeInterval.Duration, cfg.Gossip.ProbeTimeout.Duration
	gc.Timing.SuspicionMult = cfg.Gossip.SuspicionMult
	gc.Timing.GossipInterval = cfg.Gossip.GossipInterval.Duration
	if cfg.Gossip.Advertise != "" {
		gc.AdvertiseAddr, gc.AdvertisePort, _ = splitHostPort(cfg.Gossip.Advertise)
	}
	var agent *health.Agent
	poke := func() {
		if agent != nil {
			agent.Poke()
		}
	}
	gc.OnPeerChange = poke
	g, err := health.StartGossip(gc)
	if err != nil {
		return err
	}
	go g.WatchKeyFile(ctx, cfg.Gossip.KeyFile, health.KeyFileCheck) // a rotation: a mounted Secret changes in place
	switch {
	case enrol != nil:
		go enrol.Run(ctx, g.SetPinned) // the hub's ConfigMap: members enrolled, re-keyed
	case gc.Pinned != nil:
		go g.WatchPinnedFile(ctx, cfg.Gossip.PinnedFile, health.KeyFileCheck) // a member added or re-keyed
	}

	var etcd *health.Etcd
	switch {
	case cfg.Role == RoleWitness && len(cfg.Etcd.Endpoints) > 0:
		etcd, err = health.NewEtcdOutside(cfg.Etcd.Endpoints, cfg.Etcd.TLS)
	case cfg.Role == RoleAgent && cfg.Probes.enabled("etcd"):
		etcd, err = health.NewEtcd(cfg.Etcd)
	}
	if err != nil {
		_ = g.Shutdown()
		return err
	}
	if etcd != nil {
		defer etcd.Close()
	}
	specs, err := probeSpecs(cfg, etcd, g)
	if err != nil {
		_ = g.Shutdown()
		return err
	}
	runner, err := health.NewRunner(specs, log, poke)
	if err != nil {
		_ = g.Shutdown()
		return err
	}
	agent = health.NewAgent(g, runner, etcd, cfg.ReportInterval.Duration, log).WatchKubeadm(cfg.KubeadmTmpDir)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newAgentCollector(agent),
		health.NewGossipCollector(agent.Gossip(), "hale_agent"))
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		_ = g.Shutdown()
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	srv := &http.Server{Handler: httpHandler(agent, cfg, reg), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	if cfg.Gossip.joins() {
		go g.JoinLoop(ctx, func() []string {
			peers := slices.Clone(cfg.Gossip.Join)
			if cfg.Gossip.JoinMembers {
				peers = append(peers, agent.MemberPeers(g.Port(), g.Addr())...)
			}
			return peers
		})
	}
	log.Info("agent started", "role", cfg.Role, "node", cfg.Node, "cluster", cfg.Cluster, "gossip", g.Addr(), "http", ln.Addr().String(), "probes", len(specs))
	if ready != nil {
		ready <- ln.Addr().String()
	}
	err = agent.Run(ctx, 5*time.Second)
	log.Info("agent stopped")
	return err
}

func probeSpecs(cfg Config, etcd *health.Etcd, clock health.ClockSource) ([]health.ProbeSpec, error) {
	env := health.ProbeEnv{Clock: clock}
	if cfg.Role == RoleAgent {
		env.Etcd = etcd
	}
	var specs []health.ProbeSpec
	for _, name := range health.ProbeNames() {
		if !cfg.Probes.enabled(name) {
			continue
		}
		s := cfg.Probes.section(name)
		probe, err := s.New(env)
		if err != nil {
			return nil, fmt.Errorf("probes.%s: %w", name, err)
		}
		if probe != nil {
			c := s.Common()
			specs = append(specs, health.ProbeSpec{Probe: probe, Interval: c.Interval.Duration, Timeout: c.Timeout.Duration, FailureThreshold: c.FailureThreshold})
		}
	}
	return specs, nil
}

// httpHandler serves /healthz (the agent loop publishes), /readyz (it has published and, when peers
// are configured, sees at least one) and /metrics.
func httpHandler(a *health.Agent, cfg Config, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, last := a.Status()
		if time.Since(last) > 3*cfg.ReportInterval.Duration+5*time.Second {
			http.Error(w, fmt.Sprintf("no report published since %v", last.Format(time.RFC3339)), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		n, _ := a.Status()
		var problems []string
		if n == 0 {
			problems = append(problems, "no report published yet")
		}
		if cfg.Gossip.joins() && len(a.Gossip().Reports()) < 2 {
			problems = append(problems, "no peer's report received yet")
		}
		if len(problems) > 0 {
			http.Error(w, strings.Join(problems, "; "), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// enrolment is the in-cluster enrolment of this agent's identity key (gossip.enrol: kubernetes).
func enrolment(cfg Config, log *slog.Logger) (*identity.Enrolment, error) {
	id, created, err := identity.LoadOrCreateIdentity(cfg.Gossip.IdentityFile)
	if err != nil {
		return nil, err
	}
	if created {
		log.Info("created this member's identity key; enrolling it through the API server", "file", cfg.Gossip.IdentityFile, "key", id.Public().String())
	}
	return identity.InClusterEnrolment(cfg.Node, cfg.Gossip.PinnedFile, id, log)
}
