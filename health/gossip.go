package health

import (
	"compress/gzip"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/internal/logdedup"
	"github.com/hashicorp/memberlist"
)

// Timing is the failure-detection tuning of the gossip pool.
type Timing struct {
	// ProbeInterval is how often each member probes a random peer; ProbeTimeout how long it waits for
	// the ack before asking others to probe indirectly.
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	// SuspicionMult: a suspect is declared dead after SuspicionMult × ProbeInterval (scaled by
	// log10 of the pool size, which is 1 below 10 members) unless it refutes.
	SuspicionMult int
	// GossipInterval is how often queued broadcasts (new reports, suspicions) are sent.
	GossipInterval time.Duration
	// PushPullInterval is how often full state is exchanged with one peer over TCP.
	PushPullInterval time.Duration
}

// DefaultTiming is Hale's tuning for control planes of 3 to 7 nodes on one LAN: every member probes a
// peer each 100 ms, misses an ack after 50 ms (then asks 3 others to probe indirectly and tries TCP),
// and a suspect that does not refute within 2 × 100 ms is declared dead (memberlist needs no
// confirmations below 4 members and scales the timeout by log10 of the pool, 1 below 10 members).
// Measured on 5 members: p50 ~0.4 s, p99 under 1 s (BenchmarkFailureDetection). The price: ~10
// small UDP probes a second per member, and a member that cannot answer within 50 ms (a saturated
// link, a stalled process) is suspected sooner; it refutes as soon as it hears of it, and indirect and
// TCP probes keep a lossy link from being taken for a dead one (TestGossipLossyLink: 20 % loss, 60 s,
// nobody declared dead). Slower, noisier networks should raise ProbeInterval and SuspicionMult.
//
// Full state is exchanged with one peer every 5 s (memberlist's LAN default is 30 s). That is what
// brings back a member restarted under its old name when its peers missed its rejoin: they hold it
// dead at a higher incarnation than the fresh process announces, and ignore its alive messages until
// a push/pull tells it it is dead and it refutes. Seen in the demo's quorum-lost scenario under load:
// two machines rebooted at once, one came back joined only to the other, and the hub saw it dead for
// 40 s. With 3-7 members a push/pull every 5 s is a few KB.
func DefaultTiming() Timing {
	return Timing{ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond, SuspicionMult: 2,
		GossipInterval: 100 * time.Millisecond, PushPullInterval: 5 * time.Second}
}

// LANTiming is memberlist's DefaultLANConfig tuning (1 s probes, 4× suspicion), for comparison.
func LANTiming() Timing {
	c := memberlist.DefaultLANConfig()
	return Timing{ProbeInterval: c.ProbeInterval, ProbeTimeout: c.ProbeTimeout, SuspicionMult: c.SuspicionMult,
		GossipInterval: c.GossipInterval, PushPullInterval: c.PushPullInterval}
}

// GossipConfig configures a member of the gossip pool.
type GossipConfig struct {
	// Node is this member's name (the node name for agents).
	Node string
	// Cluster names the pool; it is memberlist's label, so two clusters on one network never merge.
	Cluster string
	// Role is "agent" or "hub", gossiped as node metadata.
	Role string
	// BindAddr and BindPort to listen on (UDP and TCP); AdvertiseAddr/Port when they differ.
	BindAddr      string
	BindPort      int
	AdvertiseAddr string
	AdvertisePort int
	// Keys encrypt the gossip: 16, 24 or 32 bytes each; the first encrypts, all decrypt. Required.
	Keys   [][]byte
	Timing Timing
	Logger *slog.Logger
	// Transport replaces the network transport (NewTransport on BindAddr:BindPort; tests wrap it to
	// drop packets).
	Transport memberlist.Transport
	// OnPeerChange, when set, is called after a peer joins, dies or leaves (from memberlist's event
	// loop: it must not block).
	OnPeerChange func()
	// ReconnectInterval is how often peers lost to a partition are joined again (default 2 s); see
	// Gossip.reconnect.
	ReconnectInterval time.Duration
	// KeyAdoptDelay: see SetKeys (DefaultKeyAdoptDelay when 0; negative: at once).
	KeyAdoptDelay time.Duration
	// Identity signs this member's reports and the claim in its metadata that binds its name to its
	// address; Pinned are the keys every member's signatures are checked against (SetPinned replaces
	// them). With both set, a report or an alive message that is unsigned or not signed by a key pinned
	// for the name it gives is refused and counted (Rejected). Without, the pool key alone guards the
	// pool. One is not set without the other.
	Identity *identity.Identity
	Pinned   *identity.Pinned
}

// Gossip is one member of the encrypted gossip pool: it spreads this member's latest report, keeps
// the newest report of every other member, and tracks peer liveness. Split by concern, as memberlist
// is: start and stop here; join, rejoin and peer views in membership.go; reports published, merged
// and rejected (and clock offsets) in reports.go; the gossip keys and the pinned identities in
// keys.go; memberlist's delegates in delegates.go.
type Gossip struct {
	started   time.Time
	cfg       GossipConfig
	transport memberlist.Transport
	ml        *memberlist.Memberlist
	keyring   *memberlist.Keyring
	relay     *memberlist.TransmitLimitedQueue // others' reports, passed on once
	log       *slog.Logger
	dedup     *logdedup.Dedup
	rejoin    time.Duration // RejoinEvery (tests shorten it)

	mu       sync.Mutex
	version  uint64
	reports  map[string]*Report
	encoded  map[string][]byte
	peers    map[string]PeerView
	clock    map[string]clockSample
	rejected map[string]int    // by reason
	pinned   identity.Pinned   // the keys signatures are checked against (when cfg.Identity is set)
	expired  map[string]uint64 // the last version of members that left long ago
	stopped  bool
	// adopt, when set, makes the key file's new first key the one to encrypt with (SetKeys).
	adopt    *time.Timer
	keyOrder int
	zw       *gzip.Writer // reused by Publish, under mu
	// addrs is each peer's last gossip address as memberlist knew it; reported the one its reports
	// give (for peers this member never met: a hub restarted while they were cut off).
	addrs, reported map[string]string
	// nodes are the live peers as memberlist last described them, copied in its callbacks (which run
	// under its node lock): the *Node values its Members returns are rewritten in place by its alive
	// handling (address, meta, protocol versions), so reading them afterwards is a data race
	// (hashicorp/memberlist#306). Only their names are read from Members.
	nodes   map[string]memberlist.Node
	keep    map[string]bool // KeepJoined's
	joining map[string]bool // a reconnect attempt in flight
	done    chan struct{}   // closed by Shutdown
}

// StartGossip starts a member. Join connects it to a pool.
func StartGossip(cfg GossipConfig) (*Gossip, error) {
	if cfg.Node == "" || cfg.Cluster == "" {
		return nil, errors.New("gossip: node and cluster names are required")
	}
	if len(cfg.Keys) == 0 {
		return nil, errors.New("gossip: encryption is mandatory: give a key file (make one with: head -c 32 /dev/urandom | base64)")
	}
	keyring, err := memberlist.NewKeyring(cfg.Keys[1:], cfg.Keys[0])
	if err != nil {
		return nil, fmt.Errorf("gossip keys: %w", err)
	}
	if cfg.Timing == (Timing{}) {
		cfg.Timing = DefaultTiming()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReconnectInterval <= 0 {
		cfg.ReconnectInterval = 2 * time.Second
	}
	if cfg.KeyAdoptDelay == 0 {
		cfg.KeyAdoptDelay = DefaultKeyAdoptDelay
	}
	if (cfg.Identity == nil) != (cfg.Pinned == nil) {
		return nil, errors.New("gossip: an identity and the pinned keys go together: give both or neither")
	}
	g := &Gossip{started: time.Now().UTC(), cfg: cfg, keyring: keyring, rejoin: RejoinEvery, log: cfg.Logger.With("gossip", cfg.Cluster), reports: map[string]*Report{},
		encoded: map[string][]byte{}, peers: map[string]PeerView{}, clock: map[string]clockSample{},
		rejected: map[string]int{}, expired: map[string]uint64{},
		addrs: map[string]string{}, reported: map[string]string{}, nodes: map[string]memberlist.Node{}, keep: map[string]bool{}, joining: map[string]bool{}, done: make(chan struct{})}
	g.dedup = logdedup.New(g.log)
	if cfg.Pinned != nil {
		g.pinned = *cfg.Pinned
	}

	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Node
	mc.Label = cfg.Cluster
	mc.BindAddr, mc.BindPort = cfg.BindAddr, cfg.BindPort
	mc.AdvertiseAddr, mc.AdvertisePort = cfg.AdvertiseAddr, cfg.AdvertisePort
	mc.Keyring = keyring
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	// Reports are gzipped already; memberlist's LZW pass would cost an allocation-heavy writer per
	// message for nothing.
	mc.EnableCompression = false
	mc.ProbeInterval, mc.ProbeTimeout = cfg.Timing.ProbeInterval, cfg.Timing.ProbeTimeout
	mc.SuspicionMult = cfg.Timing.SuspicionMult
	mc.GossipInterval = cfg.Timing.GossipInterval
	// memberlist counts every send of a broadcast against its retransmit limit and sends each round to
	// GossipNodes random peers; with its defaults (3 peers, limit 4 for small pools) a membership change
	// can miss a peer until the next push/pull. Control planes are small: gossip to every peer (up to 6,
	// a 7-node pool) and allow two full rounds.
	mc.GossipNodes, mc.RetransmitMult = 6, 8
	// A node that was declared dead and comes back from another address (a re-provisioned machine, a
	// new pod IP) may take its name back after a second instead of never.
	mc.DeadNodeReclaimTime = time.Second
	mc.PushPullInterval = cfg.Timing.PushPullInterval
	mc.Delegate = (*delegate)(g)
	mc.Events = (*events)(g)
	if cfg.Identity != nil {
		mc.Alive = (*aliveCheck)(g)
	}
	mc.Logger = log.New(g.dedup, "", 0)
	mc.Transport = cfg.Transport
	if mc.Transport == nil {
		t, err := NewTransport(cfg.BindAddr, cfg.BindPort, g.log)
		if err != nil {
			return nil, err
		}
		mc.Transport = t
	}
	g.transport = mc.Transport
	numNodes := func() int { return g.ml.NumMembers() }
	g.relay = &memberlist.TransmitLimitedQueue{NumNodes: numNodes, RetransmitMult: 1}
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = mc.Transport.Shutdown()
		return nil, fmt.Errorf("gossip on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
	}
	g.ml = ml
	go g.reconnectLoop()
	return g, nil
}

// Addr is where this member listens.
func (g *Gossip) Addr() string {
	n := g.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Port is the gossip port this member advertises.
func (g *Gossip) Port() int { return int(g.ml.LocalNode().Port) }

// Leave tells the pool this member is leaving, so that peers record it as "left", not "dead", and
// stops it. (memberlist does not tell its event delegate a leave from a death, so the member first
// gossips a last report marked Leaving.)
func (g *Gossip) Leave(timeout time.Duration) error {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return nil // memberlist panics on a leave after shutdown
	}
	last := Report{}
	if r, ok := g.reports[g.cfg.Node]; ok {
		last = *r
	}
	g.mu.Unlock()
	last.Leaving = true
	if err := g.Publish(last); err != nil {
		g.log.Warn("could not announce leaving; peers may record this member as dead", "err", err)
	}
	err := g.ml.Leave(timeout)
	if err != nil && (g.ml.NumMembers() <= 1 || strings.Contains(err.Error(), "timeout waiting for leave broadcast")) {
		// Nobody acknowledged the leave in time (every peer is stopping too, or none is left): the
		// peers that remain will find this member dead instead. Not a failure of this member.
		g.log.Warn("leave not acknowledged in time; peers may record this member as dead", "err", err)
		err = nil
	}
	if serr := g.Shutdown(); err == nil {
		err = serr
	}
	return err
}

// Done is closed once the member has stopped (Shutdown, Leave).
func (g *Gossip) Done() <-chan struct{} { return g.done }

// Shutdown stops the member without a word (peers will find it dead): what a crash looks like.
func (g *Gossip) Shutdown() error {
	g.mu.Lock()
	if !g.stopped {
		close(g.done)
	}
	g.stopped = true
	if g.adopt != nil {
		g.adopt.Stop()
	}
	g.mu.Unlock()
	return g.ml.Shutdown()
}

// Started is when this member started.
func (g *Gossip) Started() time.Time { return g.started }
