// Command agent runs on every control-plane node: it probes the node, reads etcd membership from the
// local member, and gossips a versioned report to its peers over encrypted memberlist. It never acts.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hale-dev/hale/health"
)

// version is set at build time (deploy/image/build-binaries: -X main.version=...).
var version = "dev"

func main() {
	// The agent is light but wakes often (gossip probes every 100 ms): with more than one P the Go
	// scheduler spins idle threads looking for work, which measurably costs more than the work itself
	// (5 idle agents: ~0.67 % of a core each at 2 Ps, ~0.55 % at 1). GOMAXPROCS in the environment wins.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

// run parses flags and config and runs the agent until ctx ends. ready, when set, receives the
// address of the HTTP endpoint once everything is up (tests use it).
func run(ctx context.Context, args []string, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "YAML config file (flags below override it)")
	node := fs.String("node", "", "this node's name in the pool (default: host name)")
	cluster := fs.String("cluster", "", "the pool's name, the same on every node of a cluster")
	role := fs.String("role", "", "agent (a control-plane node, the default) or witness (another host that observes and votes)")
	bind := fs.String("bind", "", "gossip host:port (default 0.0.0.0:7946)")
	join := fs.String("join", "", "comma-separated host:port of peers to join")
	keyFile := fs.String("key-file", "", "gossip key file (base64 keys, one a line)")
	identityFile := fs.String("identity-file", "", "this node's signing key (created when missing; with -pinned-file)")
	pinnedFile := fs.String("pinned-file", "", "every member's public key, one NAME ed25519:BASE64 a line (with -identity-file)")
	printIdentity := fs.Bool("print-identity", false, "print this node's line for the pinned-keys file (creating its key when missing) and exit")
	listen := fs.String("listen", "", "host:port for /healthz, /readyz and /metrics (default 127.0.0.1:9101)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintln(stderr, "hale agent", version)
		return nil
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level %q: want debug, info, warn or error", *logLevel)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	cfg, err := loadConfig(*configPath)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		flag string
		dst  *string
	}{{*node, &cfg.Node}, {*cluster, &cfg.Cluster}, {*role, &cfg.Role}, {*bind, &cfg.Gossip.Bind}, {*keyFile, &cfg.Gossip.KeyFile},
		{*identityFile, &cfg.Gossip.IdentityFile}, {*pinnedFile, &cfg.Gossip.PinnedFile}, {*listen, &cfg.Listen}} {
		if f.flag != "" {
			*f.dst = f.flag
		}
	}
	if *join != "" {
		cfg.Gossip.Join = strings.Split(*join, ",")
	}
	cfg = cfg.withDefaults()
	if *printIdentity {
		if cfg.Gossip.IdentityFile == "" {
			return errors.New("-print-identity: no identity file (gossip.identityFile or -identity-file)")
		}
		id, _, err := health.LoadOrCreateIdentity(cfg.Gossip.IdentityFile)
		if err != nil {
			return err
		}
		fmt.Fprintln(os.Stdout, cfg.Node, id.Public())
		return nil
	}
	if err := cfg.validate(); err != nil {
		return err
	}
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
	if gc.Identity, gc.Pinned, err = health.LoadIdentities(cfg.Node, cfg.Node, cfg.Gossip.IdentityFile, cfg.Gossip.PinnedFile, log); err != nil {
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
	if gc.Pinned != nil {
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
	agent = health.NewAgent(g, runner, etcd, cfg.ReportInterval.Duration, log)

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

	if len(cfg.Gossip.Join) > 0 {
		go g.JoinLoop(ctx, cfg.Gossip.Join)
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
			specs = append(specs, health.ProbeSpec{Probe: probe, Interval: s.Common().Interval.Duration, Timeout: s.Common().Timeout.Duration})
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
		if len(cfg.Gossip.Join) > 0 && len(a.Gossip().Reports()) < 2 {
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
