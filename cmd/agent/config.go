package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hale-dev/hale/config"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/health/identity"
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
	Role string `json:"role"`
	// Gossip is how the agent reaches its peers and the hub.
	Gossip GossipConfig `json:"gossip"`
	// ReportInterval is the longest time between two reports (default 5 s; a probe or peer that
	// changes state is reported at once, and so is a change in the etcd view, looked at every second;
	// while a peer is dead or a member unreachable the agent reports every second; liveness itself
	// comes from the gossip's probes).
	ReportInterval Duration `json:"reportInterval"`
	// Listen serves /healthz, /readyz and /metrics (default 127.0.0.1:9101).
	Listen string `json:"listen"`
	// Etcd is how the agent reads etcd: its local member (default: kubeadm's endpoint and client
	// certificate), or, on a witness, every member from outside.
	Etcd health.EtcdConfig `json:"etcd"`
	// Probes has a section per probe, by its name (below); a probe without one runs with its
	// defaults.
	Probes ProbesConfig `json:"probes"`
	// KubeadmTmpDir is kubeadm's temporary directory, where `kubeadm upgrade` keeps the new static pod
	// manifests while it replaces them: each report says whether an upgrade is under way on this node,
	// planned work during which the hub starts nothing on it (the hub's policy.plannedWork
	// kubeadmUpgrade). Default /etc/kubernetes/tmp on an agent ("-": none); a witness has none.
	KubeadmTmpDir string `json:"kubeadmTmpDir"`
}

// joins says whether the agent has peers to join (listed, or etcd's members).
func (c GossipConfig) joins() bool { return len(c.Join) > 0 || c.JoinMembers }

// GossipConfig is the gossip section.
type GossipConfig struct {
	// Bind is host:port for UDP and TCP gossip (default 0.0.0.0:7946).
	Bind string `json:"bind"`
	// Advertise is the host:port peers should reach this agent at, when it is not the bound address
	// (NAT, 0.0.0.0; default: the bind address, or the host's first private address).
	Advertise string `json:"advertise"`
	// Join lists peers (host:port, or a name resolving to several) to join at start; retried with
	// backoff until one answers. A node that is not the first needs at least one.
	Join []string `json:"join"`
	// JoinMembers also joins the agents beside etcd's members: each member's peer URL host at this
	// agent's gossip port (every agent uses the same one), from the membership the agent reads. No
	// name to resolve, no list to keep: on Kubernetes, the agents of a DaemonSet find each other
	// through etcd, even while cluster DNS is down with the control plane.
	JoinMembers bool `json:"joinMembers"`
	// KeyFile holds the base64 gossip keys, one a line, the first used to encrypt. Required.
	KeyFile string `json:"keyFile"`
	// IdentityFile is this node's own signing key (Ed25519, PEM; created on first start when
	// missing). With pinnedFile, every report and every claim to a name is signed, and checked against
	// the pinned keys (docs/identities.md).
	IdentityFile string `json:"identityFile"`
	// PinnedFile lists every member's public key, one "NAME ed25519:BASE64" a line (with
	// identityFile). With enrol, it is the agent's own copy of the pinned keys the hub keeps.
	PinnedFile string `json:"pinnedFile"`
	// Enrol: "kubernetes" (on Kubernetes, the default manifests' way): the agent enrols its key
	// through the API server (a CertificateSigningRequest the hub approves for the node the agent's
	// pod runs on) and reads the pinned keys from the ConfigMap hale-pinned-keys, which the hub keeps;
	// no key step by hand. Empty: the operator writes pinnedFile.
	Enrol string `json:"enrol"`
	// InsecureNoIdentities turns per-node identities off (no identityFile, no pinnedFile): the
	// gossip key alone guards the pool, and any holder of it can speak for any member.
	InsecureNoIdentities bool `json:"insecureNoIdentities"`
	// ProbeInterval is how often the agent probes a random peer for liveness (default 100 ms).
	ProbeInterval Duration `json:"probeInterval"`
	// ProbeTimeout is how long a liveness probe waits for its answer before asking others to try
	// (default 50 ms).
	ProbeTimeout Duration `json:"probeTimeout"`
	// SuspicionMult: a suspected peer is declared dead after suspicionMult × probeInterval, scaled by
	// the pool's size (default 2).
	SuspicionMult int `json:"suspicionMult"`
	// GossipInterval is how often queued membership news is sent to peers that no probe reached
	// (default 100 ms; news also rides on every probe and its answer).
	GossipInterval Duration `json:"gossipInterval"`
}

// ProbesConfig is the probes section: one section per kind of probe, by its name (health.ProbeKinds:
// each probe's own file registers its section and defaults).
type ProbesConfig map[string]health.ProbeSection

// UnmarshalJSON reads each section into its kind's own type, strictly: an unknown probe or field is
// an error that names it.
func (p *ProbesConfig) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("probes: %w", err)
	}
	out := ProbesConfig{}
	for _, name := range slices.Sorted(maps.Keys(raw)) {
		k, err := health.LookupProbe(name)
		if err != nil {
			return fmt.Errorf("probes.%s: %w", name, err)
		}
		s := k.Section()
		if string(raw[name]) != "null" {
			dec := json.NewDecoder(bytes.NewReader(raw[name]))
			dec.DisallowUnknownFields()
			if err := dec.Decode(s); err != nil {
				return fmt.Errorf("probes.%s: %w", name, err)
			}
		}
		out[name] = s
	}
	*p = out
	return nil
}

// section is the named probe's section (every kind has one once defaults are applied).
func (p ProbesConfig) section(name string) health.ProbeSection { return p[name] }

// enabled says whether the named probe runs.
func (p ProbesConfig) enabled(name string) bool {
	s, ok := p[name]
	return ok && s.Common().Enabled != nil && *s.Common().Enabled
}

// withDefaults is a copy with a section for every kind, each with its kind's defaults; a witness's
// probes are off unless it says otherwise (and then validate refuses them).
func (p ProbesConfig) withDefaults(role string) ProbesConfig {
	out := ProbesConfig{}
	for _, k := range health.ProbeKinds() {
		s := k.Section()
		if have, ok := p[k.Name]; ok {
			reflect.ValueOf(s).Elem().Set(reflect.ValueOf(have).Elem())
		}
		k.Defaults(s, role != RoleWitness)
		out[k.Name] = s
	}
	return out
}

// loadConfig reads path strictly: an unknown field is an error that names it. A relative file or
// directory path in it is the config file's directory's (as a kubeconfig's are), not the working
// directory's; a path given by a flag stays the working directory's.
func loadConfig(path string) (Config, error) {
	var c Config
	if path == "" {
		return c, nil
	}
	if err := config.Load("agent config", path, &c); err != nil {
		return c, err
	}
	config.RelativeTo(path, &c.Gossip.KeyFile, &c.Gossip.IdentityFile, &c.Gossip.PinnedFile, &c.Etcd.TLS.CA, &c.Etcd.TLS.Cert, &c.Etcd.TLS.Key)
	for _, s := range c.Probes {
		if ps, ok := s.(health.PathsSection); ok {
			config.RelativeTo(path, ps.Paths()...)
		}
	}
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
	if c.Role != RoleWitness {
		c.Etcd = c.Etcd.WithDefaults()
		if c.KubeadmTmpDir == "" {
			c.KubeadmTmpDir = "/etc/kubernetes/tmp"
		}
	}
	if c.KubeadmTmpDir == "-" || c.Role == RoleWitness {
		c.KubeadmTmpDir = ""
	}
	c.Probes = c.Probes.withDefaults(c.Role)
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

// EnrolKubernetes is gossip.enrol's value for enrolment through the API server.
const EnrolKubernetes = "kubernetes"

// validate names the first field that is wrong.
func (c Config) validate() error {
	switch {
	case c.Role != RoleAgent && c.Role != RoleWitness:
		return fmt.Errorf("role %q: want agent (a control-plane node) or witness (another host that observes and votes)", c.Role)
	case c.Role == RoleWitness && c.Etcd.Endpoint != "":
		return errors.New("etcd.endpoint: a witness runs no etcd member; list the members' client URLs under etcd.endpoints to watch etcd from outside")
	case c.Role == RoleAgent && len(c.Etcd.Endpoints) > 0:
		return errors.New("etcd.endpoints: only a witness reads etcd from outside; an agent reads its own member at etcd.endpoint")
	case c.Etcd.Endpoint != "" && !strings.HasPrefix(c.Etcd.Endpoint, "http://") && !strings.HasPrefix(c.Etcd.Endpoint, "https://"):
		return fmt.Errorf("etcd.endpoint: %q: want an http:// or https:// URL (kubeadm's member: https://127.0.0.1:2379)", c.Etcd.Endpoint)
	case c.Role == RoleWitness && slices.ContainsFunc(health.ProbeNames(), c.Probes.enabled):
		return errors.New("probes: a witness runs none (it is not a machine Hale heals); remove the probes section or set role: agent")
	case c.Cluster == "":
		return errors.New("cluster: required (the gossip pool's name; use the same on every node of a cluster)")
	case c.Gossip.KeyFile == "":
		return errors.New("gossip.keyFile: required: gossip is always encrypted (make a key with: head -c 32 /dev/urandom | base64)")
	case c.Node == "":
		return errors.New("node: empty and the host name is unknown; set it")
	case c.Gossip.InsecureNoIdentities && (c.Gossip.IdentityFile != "" || c.Gossip.PinnedFile != "" || c.Gossip.Enrol != ""):
		return errors.New("gossip.insecureNoIdentities: true, and gossip.identityFile, pinnedFile or enrol: identities are either on or off; remove one")
	case (c.Gossip.IdentityFile == "") != (c.Gossip.PinnedFile == ""):
		return errors.New("gossip.identityFile and gossip.pinnedFile go together: this node's key signs, the pinned keys check the others' (with enrol: kubernetes, pinnedFile is its copy of them)")
	case c.Gossip.Enrol != "" && c.Gossip.Enrol != EnrolKubernetes:
		return fmt.Errorf("gossip.enrol: %q: want kubernetes (enrol through the API server), or leave it empty (the operator writes gossip.pinnedFile)", c.Gossip.Enrol)
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
	for _, d := range []struct {
		field string
		value Duration
	}{{"reportInterval", c.ReportInterval}, {"gossip.probeInterval", c.Gossip.ProbeInterval}, {"gossip.probeTimeout", c.Gossip.ProbeTimeout},
		{"gossip.gossipInterval", c.Gossip.GossipInterval}} {
		if d.value.Duration < 0 {
			return fmt.Errorf("%s %v: must not be negative", d.field, d.value)
		}
	}
	for _, name := range health.ProbeNames() {
		s := c.Probes.section(name)
		cfg := s.Common()
		switch iv, to := cfg.Interval.Duration, cfg.Timeout.Duration; {
		case iv < 0 || to < 0:
			return fmt.Errorf("probes.%s: interval %v and timeout %v must not be negative", name, cfg.Interval, cfg.Timeout)
		case to > iv:
			return fmt.Errorf("probes.%s.timeout %v: must not be longer than its interval %v", name, cfg.Timeout, cfg.Interval)
		case cfg.FailureThreshold < 0:
			return fmt.Errorf("probes.%s.failureThreshold %d: must not be negative (1: a probe fails at its first failed run)", name, cfg.FailureThreshold)
		}
		if v, ok := s.(health.ValidatedSection); ok {
			if err := v.Validate(); err != nil {
				return fmt.Errorf("probes.%s.%w", name, err)
			}
		}
	}
	if c.Gossip.ProbeTimeout.Duration >= c.Gossip.ProbeInterval.Duration {
		return fmt.Errorf("gossip.probeTimeout %v: must be shorter than gossip.probeInterval %v", c.Gossip.ProbeTimeout, c.Gossip.ProbeInterval)
	}
	if c.Gossip.SuspicionMult < 1 {
		return fmt.Errorf("gossip.suspicionMult %d: must be at least 1", c.Gossip.SuspicionMult)
	}
	if c.Gossip.IdentityFile == "" && !c.Gossip.InsecureNoIdentities {
		return fmt.Errorf("gossip.identityFile and gossip.pinnedFile: per-node identities are on by default: this node's key signs its reports, the pinned keys check the others' "+
			"(docs/identities.md; on Kubernetes, with enrol: kubernetes, nothing to do by hand); or set gossip.insecureNoIdentities: true: %s", identity.IdentitiesOff)
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
