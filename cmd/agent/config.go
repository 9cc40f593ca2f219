package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/hale-dev/hale/config"
	"github.com/hale-dev/hale/health"
)

// Duration is config.Duration.
type Duration = config.Duration

// Config is the agent's configuration file. Every field has a default but cluster and keyFile.
type Config struct {
	// Node names this agent in the pool (default: the host name).
	Node string `json:"node"`
	// Cluster names the gossip pool; nodes of another cluster never merge.
	Cluster string `json:"cluster"`
	// Role is "agent" (default: a control-plane node with its etcd member) or "witness": a host that
	// is not a control-plane machine, which observes and votes (peer liveness, and etcd from outside
	// through etcd.endpoints) and runs no probes.
	Role   string       `json:"role"`
	Gossip GossipConfig `json:"gossip"`
	// ReportInterval is the longest time between two reports (default 5 s; a probe or peer that
	// changes state is reported at once, and liveness itself comes from the gossip's probes).
	ReportInterval Duration `json:"reportInterval"`
	// Listen serves /healthz, /readyz and /metrics (default 127.0.0.1:9101).
	Listen string            `json:"listen"`
	Etcd   health.EtcdConfig `json:"etcd"`
	Probes ProbesConfig      `json:"probes"`
}

// GossipConfig is the gossip section.
type GossipConfig struct {
	// Bind is host:port for UDP and TCP gossip (default 0.0.0.0:7946).
	Bind      string   `json:"bind"`
	Advertise string   `json:"advertise"`
	Join      []string `json:"join"`
	// KeyFile holds the base64 gossip keys, one a line, the first used to encrypt. Required.
	KeyFile string `json:"keyFile"`
	// IdentityFile is this node's own signing key (Ed25519, PEM; created on first start when
	// missing); PinnedFile lists every member's public key, one "NAME ed25519:BASE64" a line. With
	// both, every report and every claim to a name is signed, and checked against the pinned keys.
	IdentityFile  string   `json:"identityFile"`
	PinnedFile    string   `json:"pinnedFile"`
	ProbeInterval Duration `json:"probeInterval"`
	ProbeTimeout  Duration `json:"probeTimeout"`
	SuspicionMult int      `json:"suspicionMult"`
	// GossipInterval is how often queued membership news is sent to peers that no probe reached
	// (news also rides on every probe and its answer).
	GossipInterval Duration `json:"gossipInterval"`
}

// ProbeConfig is what every probe shares.
type ProbeConfig struct {
	// Enabled defaults to true; set false to drop a probe (a node without etcd drops etcd and etcdDisk).
	Enabled  *bool    `json:"enabled"`
	Interval Duration `json:"interval"`
	Timeout  Duration `json:"timeout"`
}

// ProbesConfig configures each probe.
type ProbesConfig struct {
	Kubelet struct {
		ProbeConfig
		URL string `json:"url"`
	} `json:"kubelet"`
	APIServer struct {
		ProbeConfig
		URL string          `json:"url"`
		TLS health.TLSFiles `json:"tls"`
	} `json:"apiserver"`
	Etcd     ProbeConfig `json:"etcd"`
	EtcdDisk struct {
		ProbeConfig
		DataDir        string  `json:"dataDir"`
		MinFreeBytes   uint64  `json:"minFreeBytes"`
		MinFreePercent float64 `json:"minFreePercent"`
	} `json:"etcdDisk"`
	Clock struct {
		ProbeConfig
		MaxOffset Duration `json:"maxOffset"`
	} `json:"clock"`
}

// loadConfig reads path strictly: an unknown field is an error that names it. A relative file or
// directory path in it is the config file's directory's (as a kubeconfig's are), not the working
// directory's; a path given by a flag stays the working directory's.
func loadConfig(path string) (Config, error) {
	var c Config
	if path == "" {
		return c, nil
	}
	if err := config.Load(path, &c); err != nil {
		return c, err
	}
	config.RelativeTo(path, &c.Gossip.KeyFile, &c.Gossip.IdentityFile, &c.Gossip.PinnedFile, &c.Probes.EtcdDisk.DataDir,
		&c.Etcd.TLS.CA, &c.Etcd.TLS.Cert, &c.Etcd.TLS.Key,
		&c.Probes.APIServer.TLS.CA, &c.Probes.APIServer.TLS.Cert, &c.Probes.APIServer.TLS.Key)
	return c, nil
}

// withDefaults fills what is left empty.
func (c Config) withDefaults() Config {
	if c.Node == "" {
		c.Node, _ = os.Hostname()
	}
	if c.Gossip.Bind == "" {
		c.Gossip.Bind = "0.0.0.0:7946"
	}
	if c.Role == "" {
		c.Role = RoleAgent
	}
	t := health.DefaultTiming()
	setDur(&c.Gossip.ProbeInterval, t.ProbeInterval)
	setDur(&c.Gossip.ProbeTimeout, t.ProbeTimeout)
	setDur(&c.Gossip.GossipInterval, t.GossipInterval)
	if c.Gossip.SuspicionMult == 0 {
		c.Gossip.SuspicionMult = t.SuspicionMult
	}
	setDur(&c.ReportInterval, 5*time.Second)
	if c.Listen == "" {
		c.Listen = "127.0.0.1:9101"
	}
	p := &c.Probes
	if c.Role == RoleWitness {
		// A witness has no etcd member and is not a machine Hale judges: no probes.
		no := false
		for _, pc := range []*ProbeConfig{&p.Kubelet.ProbeConfig, &p.APIServer.ProbeConfig, &p.Etcd, &p.EtcdDisk.ProbeConfig, &p.Clock.ProbeConfig} {
			if pc.Enabled == nil {
				pc.Enabled = &no
			}
		}
	} else {
		c.Etcd = c.Etcd.WithDefaults()
	}
	for _, pc := range []*ProbeConfig{&p.Kubelet.ProbeConfig, &p.APIServer.ProbeConfig, &p.Etcd, &p.EtcdDisk.ProbeConfig, &p.Clock.ProbeConfig} {
		if pc.Enabled == nil {
			yes := true
			pc.Enabled = &yes
		}
		setDur(&pc.Interval, time.Second)
		setDur(&pc.Timeout, min(800*time.Millisecond, pc.Interval.Duration))
	}
	setDur(&p.EtcdDisk.Interval, 10*time.Second)
	return c
}

func setDur(d *Duration, v time.Duration) {
	if d.Duration == 0 {
		d.Duration = v
	}
}

// Roles.
const (
	RoleAgent   = "agent"
	RoleWitness = "witness"
)

// validate names the first field that is wrong.
func (c Config) validate() error {
	switch {
	case c.Role != RoleAgent && c.Role != RoleWitness:
		return fmt.Errorf("role %q: want agent (a control-plane node) or witness (another host that observes and votes)", c.Role)
	case c.Role == RoleWitness && c.Etcd.Endpoint != "":
		return errors.New("etcd.endpoint: a witness runs no etcd member; list the members' client URLs under etcd.endpoints to watch etcd from outside")
	case c.Role == RoleAgent && len(c.Etcd.Endpoints) > 0:
		return errors.New("etcd.endpoints: only a witness reads etcd from outside; an agent reads its own member at etcd.endpoint")
	case c.Role == RoleWitness && (*c.Probes.Kubelet.Enabled || *c.Probes.APIServer.Enabled || *c.Probes.Etcd.Enabled ||
		*c.Probes.EtcdDisk.Enabled || *c.Probes.Clock.Enabled):
		return errors.New("probes: a witness runs none (it is not a machine Hale heals); remove the probes section or set role: agent")
	case c.Cluster == "":
		return errors.New("cluster: required (the gossip pool's name; use the same on every node of a cluster)")
	case c.Gossip.KeyFile == "":
		return errors.New("gossip.keyFile: required: gossip is always encrypted (make a key with: head -c 32 /dev/urandom | base64)")
	case c.Node == "":
		return errors.New("node: empty and the host name is unknown; set it")
	case (c.Gossip.IdentityFile == "") != (c.Gossip.PinnedFile == ""):
		return errors.New("gossip.identityFile and gossip.pinnedFile go together: this node's key signs, the pinned keys check the others' (set both, or neither)")
	}
	if _, _, err := splitHostPort(c.Gossip.Bind); err != nil {
		return fmt.Errorf("gossip.bind: %w", err)
	}
	if c.Gossip.Advertise != "" {
		if _, _, err := splitHostPort(c.Gossip.Advertise); err != nil {
			return fmt.Errorf("gossip.advertise: %w", err)
		}
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen %q: %w", c.Listen, err)
	}
	p := &c.Probes
	for _, d := range []struct {
		field string
		value Duration
	}{{"reportInterval", c.ReportInterval}, {"gossip.probeInterval", c.Gossip.ProbeInterval}, {"gossip.probeTimeout", c.Gossip.ProbeTimeout},
		{"gossip.gossipInterval", c.Gossip.GossipInterval}, {"probes.clock.maxOffset", p.Clock.MaxOffset}} {
		if d.value.Duration < 0 {
			return fmt.Errorf("%s %v: must not be negative", d.field, d.value)
		}
	}
	for _, pr := range []struct {
		name string
		cfg  ProbeConfig
	}{{"kubelet", p.Kubelet.ProbeConfig}, {"apiserver", p.APIServer.ProbeConfig}, {"etcd", p.Etcd}, {"etcdDisk", p.EtcdDisk.ProbeConfig}, {"clock", p.Clock.ProbeConfig}} {
		switch iv, to := pr.cfg.Interval.Duration, pr.cfg.Timeout.Duration; {
		case iv < 0 || to < 0:
			return fmt.Errorf("probes.%s: interval %v and timeout %v must not be negative", pr.name, pr.cfg.Interval, pr.cfg.Timeout)
		case to > iv:
			return fmt.Errorf("probes.%s.timeout %v: must not be longer than its interval %v", pr.name, pr.cfg.Timeout, pr.cfg.Interval)
		}
	}
	if pct := p.EtcdDisk.MinFreePercent; pct < 0 || pct >= 100 || math.IsNaN(pct) {
		return fmt.Errorf("probes.etcdDisk.minFreePercent %v: want a percentage from 0 to below 100", pct)
	}
	if c.Gossip.ProbeTimeout.Duration >= c.Gossip.ProbeInterval.Duration {
		return fmt.Errorf("gossip.probeTimeout %v: must be shorter than gossip.probeInterval %v", c.Gossip.ProbeTimeout, c.Gossip.ProbeInterval)
	}
	if c.Gossip.SuspicionMult < 1 {
		return fmt.Errorf("gossip.suspicionMult %d: must be at least 1", c.Gossip.SuspicionMult)
	}
	return nil
}

func splitHostPort(s string) (string, int, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("%q: want host:port", s)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", 0, fmt.Errorf("%q: port must be a number from 0 to 65535", s)
	}
	return host, p, nil
}
