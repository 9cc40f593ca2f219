package health

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

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
	Identity *Identity
	Pinned   *Pinned
}

// ReconnectTimeout is how long a peer that died (not one that left) is joined again: after a day it is
// taken for gone for good. Peers named with KeepJoined are joined again for as long as they are named.
const ReconnectTimeout = 24 * time.Hour

// Gossip is one member of the encrypted gossip pool: it spreads this member's latest report, keeps
// the newest report of every other member, and tracks peer liveness.
type Gossip struct {
	started   time.Time
	cfg       GossipConfig
	transport memberlist.Transport
	ml        *memberlist.Memberlist
	keyring   *memberlist.Keyring
	relay     *memberlist.TransmitLimitedQueue // others' reports, passed on once
	log       *slog.Logger
	dedup     *logDedup

	mu       sync.Mutex
	version  uint64
	reports  map[string]*Report
	encoded  map[string][]byte
	peers    map[string]PeerView
	clock    map[string]clockSample
	rejected map[string]int    // by reason
	pinned   Pinned            // the keys signatures are checked against (when cfg.Identity is set)
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

// clockSample is a peer's clock offset (its send time minus our receive time) and when it was taken.
type clockSample struct {
	offset time.Duration
	at     time.Time
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
	g := &Gossip{started: time.Now().UTC(), cfg: cfg, keyring: keyring, log: cfg.Logger.With("gossip", cfg.Cluster), reports: map[string]*Report{},
		encoded: map[string][]byte{}, peers: map[string]PeerView{}, clock: map[string]clockSample{},
		rejected: map[string]int{}, expired: map[string]uint64{},
		addrs: map[string]string{}, reported: map[string]string{}, nodes: map[string]memberlist.Node{}, keep: map[string]bool{}, joining: map[string]bool{}, done: make(chan struct{})}
	g.dedup = newLogDedup(g.log)
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

// KeepJoined names the peers this member must stay joined to for as long as they are named (the
// hub's expected observers): whenever one is not alive in this member's view it is joined again at its
// last known address, every ReconnectInterval.
func (g *Gossip) KeepJoined(nodes []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.keep)
	for _, n := range nodes {
		g.keep[n] = true
	}
}

func (g *Gossip) reconnectLoop() {
	t := time.NewTicker(g.cfg.ReconnectInterval)
	defer t.Stop()
	for {
		select {
		case <-g.done:
			return
		case <-t.C:
			g.reconnect()
		}
	}
}

// reconnect joins again every peer this member lost: those it saw die in the last ReconnectTimeout
// (not those that left on purpose), and those named by KeepJoined, when they are not alive now.
// memberlist by itself never does: it stops gossiping to a member GossipToTheDeadTime after declaring it
// dead, and its push/pulls only pick live members, so after a partition longer than that the two
// sides would stay apart for good. A join is a push/pull with the lost peer; it learns that it was
// held dead, refutes, and both sides see each other alive again within a round or two.
func (g *Gossip) reconnect() {
	alive := map[string]bool{g.cfg.Node: true}
	for _, n := range g.ml.Members() {
		alive[n.Name] = true
	}
	type target struct{ name, addr string }
	var targets []target
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return
	}
	g.expireLeft()
	lost := map[string]bool{}
	for name, pv := range g.peers {
		if pv.State == PeerDead && time.Since(pv.Since) < ReconnectTimeout {
			lost[name] = true
		}
	}
	for name := range g.keep {
		lost[name] = true
	}
	for name := range lost {
		addr := cmp.Or(g.addrs[name], g.reported[name])
		if alive[name] || addr == "" || g.joining[name] {
			continue
		}
		g.joining[name] = true
		targets = append(targets, target{name, addr})
	}
	g.mu.Unlock()
	for _, t := range targets {
		go func() {
			if _, err := g.ml.Join([]string{t.addr}); err == nil {
				g.log.Info("joined a lost peer again", "peer", t.name, "addr", t.addr)
			}
			g.mu.Lock()
			delete(g.joining, t.name)
			g.mu.Unlock()
		}()
	}
}

// LeftExpiry is how long a member that left the pool on purpose is remembered: then its last report
// is dropped, so that it is not pushed from member to member forever, and only a newer report of that
// name (the member back) is taken.
const LeftExpiry = time.Hour

// expireLeft forgets the members that left more than LeftExpiry ago. Called with g.mu held.
func (g *Gossip) expireLeft() {
	for name, pv := range g.peers {
		if pv.State != PeerLeft || time.Since(pv.Since) < LeftExpiry {
			continue
		}
		if r := g.reports[name]; r != nil {
			g.expired[name] = r.Version
		}
		for _, m := range []map[string]string{g.addrs, g.reported} {
			delete(m, name)
		}
		delete(g.peers, name)
		delete(g.reports, name)
		delete(g.encoded, name)
		delete(g.clock, name)
	}
}

// Join contacts the given peers (host:port) and returns how many answered.
func (g *Gossip) Join(peers []string) (int, error) {
	n, err := g.ml.Join(peers)
	if err != nil && n == 0 {
		return 0, fmt.Errorf("gossip: joining %v: %w", peers, err)
	}
	return n, nil
}

// JoinLoop joins peers, retrying with backoff (1 s doubling to 30 s) until one answers or ctx ends:
// at boot the peers may not be up yet.
func (g *Gossip) JoinLoop(ctx context.Context, peers []string) {
	wait := time.Second
	for {
		n, err := g.Join(peers)
		if err == nil {
			g.log.Info("joined the gossip pool", "answered", n)
			return
		}
		g.log.Warn("joining the gossip pool; will retry", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// Addr is where this member listens.
func (g *Gossip) Addr() string {
	n := g.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Publish makes r this member's latest report and spreads it. It sets Node, Cluster, Version, SentAt
// and Started.
func (g *Gossip) Publish(r Report) error {
	// memberlist's calls take its node lock, and it calls our NotifyJoin/Leave (which take g.mu) while
	// holding it: never call memberlist with g.mu held (the agent hung, its machine looked dead).
	r.Addr = g.Addr()
	g.mu.Lock()
	g.version = max(g.version+1, uint64(time.Now().UnixNano()))
	r.Node, r.Cluster, r.Version, r.SentAt, r.Started = g.cfg.Node, g.cfg.Cluster, g.version, time.Now().UTC(), g.started
	if g.zw == nil {
		g.zw, _ = gzip.NewWriterLevel(io.Discard, gzip.BestSpeed)
	}
	msg, err := r.encode(g.zw)
	if err != nil {
		g.mu.Unlock()
		return err
	}
	if g.cfg.Identity != nil {
		msg = signReport(*g.cfg.Identity, msg)
	}
	g.reports[r.Node], g.encoded[r.Node] = &r, msg
	g.mu.Unlock()

	// A control plane has a handful of members: send the report to each of them directly, over UDP
	// (TCP when it is too large for a packet even compressed), and let each receiver pass it on once
	// (the relay queue) in case a packet was lost; push/pull catches up whatever is left.
	var errs []error
	for _, m := range g.liveNodes() {
		send := g.ml.SendBestEffort
		if len(msg) > maxBroadcast {
			send = g.ml.SendReliable
		}
		if err := send(&m, msg); err != nil {
			errs = append(errs, fmt.Errorf("sending report to %s: %w", m.Name, err))
		}
	}
	return errors.Join(errs...)
}

// liveNodes returns the live peers (memberlist's members but this one), as copied in its callbacks.
func (g *Gossip) liveNodes() []memberlist.Node {
	members := g.ml.Members() // never with g.mu held (see Publish); names only (see nodes)
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]memberlist.Node, 0, len(members))
	for _, m := range members {
		if n, ok := g.nodes[m.Name]; ok && m.Name != g.cfg.Node {
			out = append(out, n)
		}
	}
	return out
}

// maxBroadcast is the largest message sent as a UDP broadcast; larger ones go over TCP.
const maxBroadcast = 1200

// Reports returns the newest report of every member (this one included), by node name.
func (g *Gossip) Reports() map[string]Report {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]Report, len(g.reports))
	for k, r := range g.reports {
		out[k] = *r
	}
	return out
}

// Peers returns every peer this member has seen, with its liveness and since when, sorted by name.
func (g *Gossip) Peers() []PeerView {
	now := time.Now().UTC()
	current := map[string]PeerState{}
	for _, n := range g.ml.Members() {
		if n.Name == g.cfg.Node {
			continue
		}
		current[n.Name] = PeerAlive // memberlist does not expose suspicion: alive until declared dead
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, st := range current {
		if pv, ok := g.peers[name]; !ok || pv.State != st {
			g.peers[name] = PeerView{Name: name, State: st, Since: now}
		}
	}
	return slices.SortedFunc(maps.Values(g.peers), func(a, b PeerView) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
}

// ClockOffsets returns, for each live peer heard from by broadcast in the last minute, its clock minus
// ours (from its report's send time and our receive time).
func (g *Gossip) ClockOffsets() []time.Duration {
	alive := map[string]bool{}
	for _, n := range g.ml.Members() {
		alive[n.Name] = true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []time.Duration
	for node, s := range g.clock {
		if alive[node] && time.Since(s.at) < time.Minute {
			out = append(out, s.offset)
		}
	}
	return out
}

// Why gossip messages are rejected (Rejected's keys, the agent's hale_agent_gossip_rejected_total
// reason label).
const (
	RejectUndecodable   = "undecodable"
	RejectUndecryptable = "undecryptable" // no installed key decrypts it
	RejectOtherCluster  = "other_cluster"
	RejectFuture        = "future"     // version or send time beyond MaxAhead
	RejectNotSender     = "not_sender" // a report under a member's name from another address
	// An alive message (a member's name at an address) whose claim is refused counts under
	// alivePrefix and the reason (alive_unsigned, alive_unknown_node, alive_bad_signature).
	alivePrefix = "alive_"
)

// rejectReasons are every reason Rejected counts.
func rejectReasons() []string {
	return []string{RejectUndecodable, RejectUndecryptable, RejectOtherCluster, RejectFuture, RejectNotSender,
		RejectUnsigned, RejectUnknownNode, RejectBadSignature,
		alivePrefix + RejectUnsigned, alivePrefix + RejectUnknownNode, alivePrefix + RejectBadSignature}
}

// MaxAhead is how far ahead of this member's clock a report's version and send time may be. The
// clock probe already fails a node off by more than half a second.
const MaxAhead = time.Minute

// reject counts a rejected message and says why, once per kind and node. Called with g.mu held.
func (g *Gossip) reject(reason, node, msg string, args ...any) {
	g.rejected[reason]++
	g.dedup.once(reason, node, msg, args...)
}

// Rejected counts the gossip messages rejected, by reason: every reason, zero or not.
func (g *Gossip) Rejected() map[string]int {
	out := map[string]int{}
	for _, r := range rejectReasons() {
		out[r] = 0
	}
	g.mu.Lock()
	maps.Copy(out, g.rejected)
	g.mu.Unlock()
	g.dedup.mu.Lock()
	out[RejectUndecryptable] = g.dedup.undecryptable
	g.dedup.mu.Unlock()
	return out
}

// DefaultKeyAdoptDelay is how long a member holds a key the key file newly makes primary before it
// encrypts with it (KeyAdoptDelay): longer than the kubelet takes to bring a changed Secret to every
// node (its sync period, a minute, plus its cache), so that every member can read the new key before
// any member writes with it.
const DefaultKeyAdoptDelay = 2 * time.Minute

// SetKeys replaces the keyring with a key file's new content: the first key encrypts, all decrypt.
// The safe rotation is three steps, each on every member before the next: add the new key second,
// move it first, drop the old one. A member that encrypts with a key a peer does not hold cannot be
// heard by that peer and looks dead to it, so when the file makes first a key this member did not
// hold (the first step skipped), the key is added at once but used for encryption only KeyAdoptDelay
// later, and that is said loudly; unless the file also drops the key in use, which leaves no choice.
func (g *Gossip) SetKeys(keys [][]byte) error {
	if len(keys) == 0 {
		return errors.New("gossip keys: none given; encryption is mandatory")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	kr := g.keyring
	has := func(set [][]byte, k []byte) bool {
		return slices.ContainsFunc(set, func(o []byte) bool { return bytes.Equal(o, k) })
	}
	held, primary := kr.GetKeys(), kr.GetPrimaryKey()
	for _, k := range keys {
		if err := kr.AddKey(k); err != nil {
			return fmt.Errorf("gossip keys: %w", err)
		}
	}
	if g.adopt != nil {
		g.adopt.Stop()
		g.adopt = nil
	}
	switch want := keys[0]; {
	case bytes.Equal(want, primary):
	case has(held, want) || g.cfg.KeyAdoptDelay <= 0:
		if err := kr.UseKey(want); err != nil {
			return fmt.Errorf("gossip keys: %w", err)
		}
	case !has(keys, primary):
		if err := kr.UseKey(want); err != nil {
			return fmt.Errorf("gossip keys: %w", err)
		}
		g.keyOrder++
		g.log.Error("gossip keys: the key file makes first a key this member did not hold and drops the key it encrypted with; " +
			"members that do not hold the new key yet cannot hear this one and will see it dead until they do. " +
			"Rotate in three steps, each on every member: add the new key second, move it first, drop the old one")
	default:
		g.keyOrder++
		g.log.Error("gossip keys: the key file makes first a key this member did not hold: it decrypts with it now and "+
			"encrypts with it from "+time.Now().Add(g.cfg.KeyAdoptDelay).UTC().Format(time.RFC3339)+", so that members "+
			"which have not read the file yet can still hear it. Rotate in three steps, each on every member: "+
			"add the new key second, move it first, drop the old one", "delay", g.cfg.KeyAdoptDelay)
		g.adopt = time.AfterFunc(g.cfg.KeyAdoptDelay, func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if has(kr.GetKeys(), want) && kr.UseKey(want) == nil {
				g.log.Info("gossip keys: now encrypting with the key the key file made first")
			}
		})
	}
	for _, old := range kr.GetKeys() {
		if !has(keys, old) && !bytes.Equal(old, kr.GetPrimaryKey()) {
			if err := kr.RemoveKey(old); err != nil {
				return fmt.Errorf("gossip keys: %w", err)
			}
		}
	}
	return nil
}

// KeyOrderErrors counts key file changes that made first a key this member did not hold (a rotation
// out of order: see SetKeys).
func (g *Gossip) KeyOrderErrors() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.keyOrder
}

// KeyFileCheck is how often agents and the hub read their gossip key file again (WatchKeyFile).
const KeyFileCheck = 5 * time.Second

// WatchKeyFile reloads the gossip keys from path whenever its content changes (a mounted Secret is
// updated in place), checking every interval until ctx ends. A file that cannot be read or holds no
// valid key is reported and changes nothing: the keys in force stay.
func (g *Gossip) WatchKeyFile(ctx context.Context, path string, interval time.Duration) {
	g.watch(ctx, path, interval, "gossip keys", func() (int, error) {
		keys, err := LoadGossipKeys(path)
		if err == nil {
			err = g.SetKeys(keys)
		}
		return len(keys), err
	})
}

// WatchPinnedFile reloads the pinned keys from path whenever its content changes (a member added or
// re-keyed; a mounted ConfigMap is updated in place), as WatchKeyFile does the gossip keys.
func (g *Gossip) WatchPinnedFile(ctx context.Context, path string, interval time.Duration) {
	g.watch(ctx, path, interval, "pinned keys", func() (int, error) {
		p, err := LoadPinned(path)
		if err == nil {
			g.SetPinned(p)
		}
		return p.Len(), err
	})
}

// watch calls load whenever the file at path holds something else than when load last succeeded,
// every interval until ctx ends (the first check loads it again: it may have changed since the start,
// and loading what is in force changes nothing). A failure is reported once and changes nothing: what
// is in force stays.
func (g *Gossip) watch(ctx context.Context, path string, interval time.Duration, what string, load func() (int, error)) {
	var last []byte
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		raw, err := os.ReadFile(path)
		if err == nil && last != nil && bytes.Equal(raw, last) {
			continue
		}
		n := 0
		if err == nil {
			n, err = load()
		}
		if err != nil {
			g.dedup.once(what, err.Error(), what+": the file cannot be used; what is in force stays", "file", path, "err", err)
			continue
		}
		if last != nil {
			g.log.Info(what+": reloaded the file", "file", path, "entries", n)
		}
		last = raw
	}
}

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

// merge keeps the report in msg if it is newer than what is known of its node, and says so.
func (g *Gossip) merge(msg []byte) (*Report, bool) {
	// Every report reaches each member from its sender and again from peers passing it on: the copies
	// are the same bytes as the report kept, and are dropped without decoding.
	g.mu.Lock()
	for _, kept := range g.encoded {
		if bytes.Equal(kept, msg) {
			g.mu.Unlock()
			return nil, false
		}
	}
	g.mu.Unlock()
	inner, sig, signed := splitSigned(msg)
	r, err := DecodeReport(inner)
	verified, why := true, ""
	if err == nil && g.cfg.Identity != nil && r.Node != g.cfg.Node {
		// Every copy is checked, a relayed one as the sender's own: only the writer's key signs it.
		g.mu.Lock()
		pinned := g.pinned
		g.mu.Unlock()
		if verified, why = pinned.verify(r.Node, inner, sig); !signed {
			verified, why = false, RejectUnsigned
		}
	}
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case err != nil:
		g.reject(RejectUndecodable, "", "dropping an undecodable gossip message", "err", err)
		return nil, false
	case r.Cluster != g.cfg.Cluster:
		g.reject(RejectOtherCluster, r.Node, "dropping a report of another cluster", "node", r.Node, "cluster", r.Cluster)
		return nil, false
	case r.Node == g.cfg.Node:
		return nil, false // our own, echoed back
	case !verified:
		g.reject(why, r.Node, "dropping a report not signed by a key pinned for the member it names: another process holding "+
			"the pool key, or a member whose key is not (yet) pinned", "node", r.Node, "reason", why, "reportAddr", r.Addr)
		return nil, false
	case r.Version > uint64(now.Add(MaxAhead).UnixNano()) || r.SentAt.After(now.Add(MaxAhead)):
		// Versions are the sender's clock in nanoseconds: one far ahead would hold off every real
		// report of that node until the clock caught up (forever, for the largest).
		g.reject(RejectFuture, r.Node, "dropping a report from the future (version or send time more than "+MaxAhead.String()+
			" ahead of this member's clock)", "node", r.Node, "sentAt", r.SentAt, "version", r.Version)
		return nil, false
	case r.Version <= g.expired[r.Node]:
		return nil, false // the last report of a member that left long ago, still pushed by a peer
	}
	if addr, met := g.addrs[r.Node]; met && r.Addr != "" && r.Addr != addr {
		// A gossip member is one name at one address: a report under a member's name from another
		// address is another process using its name (a cloned host, a copied config).
		g.reject(RejectNotSender, r.Node, "dropping a report that names a member other than its sender (another address)",
			"node", r.Node, "memberAddr", addr, "reportAddr", r.Addr)
		return nil, false
	}
	if old, ok := g.reports[r.Node]; ok && old.Version >= r.Version {
		return nil, false
	}
	g.reports[r.Node], g.encoded[r.Node] = r, msg
	if r.Addr != "" {
		g.reported[r.Node] = r.Addr
	}
	return r, true
}

// delegate is memberlist's Delegate: report dissemination.
type delegate Gossip

// NodeMeta is the member's role and when it started ("hub 1795427856621597056"): a hub tells from it
// whether another hub shares its pool, and which started first. With an identity, a third field signs
// the claim that this name is at this address (aliveClaim): the pool's other members let the name be
// alive only at an address its own key signed.
func (d *delegate) NodeMeta(limit int) []byte {
	started := d.started.UnixNano()
	meta := []byte(d.cfg.Role + " " + strconv.FormatInt(started, 10))
	if d.cfg.Identity != nil {
		ip, port, err := d.transport.FinalAdvertiseAddr(d.cfg.AdvertiseAddr, d.cfg.AdvertisePort)
		if err == nil {
			addr := net.JoinHostPort(ip.String(), strconv.Itoa(port))
			sig := d.cfg.Identity.sign(aliveClaim(d.cfg.Cluster, d.cfg.Node, addr, d.cfg.Role, started))
			meta = append(append(meta, ' '), base64.StdEncoding.EncodeToString(sig)...)
		}
	}
	if len(meta) > limit {
		return meta[:limit]
	}
	return meta
}

// parseMeta reads NodeMeta's fields (a missing signature is nil).
func parseMeta(meta []byte) (role string, started int64, sig []byte) {
	f := strings.Fields(string(meta))
	if len(f) > 0 {
		role = f[0]
	}
	if len(f) > 1 {
		started, _ = strconv.ParseInt(f[1], 10, 64)
	}
	if len(f) > 2 {
		sig, _ = base64.StdEncoding.DecodeString(f[2])
	}
	return role, started, sig
}

// aliveCheck is memberlist's AliveDelegate when the members have identities: an alive message (a
// member's name at an address, from a join, a push/pull, gossip or a refutation) is taken only when
// its metadata's claim is signed by a key pinned for that name, for that address. So a process
// holding the pool key cannot take a member's name over while its agent restarts (memberlist moves a
// dead name to a new address after DeadNodeReclaimTime), nor announce a name it has no key for.
// (memberlist calls it under its node lock: it must not call memberlist.)
type aliveCheck Gossip

func (c *aliveCheck) NotifyAlive(peer *memberlist.Node) error {
	g := (*Gossip)(c)
	role, started, sig := parseMeta(peer.Meta)
	claim := aliveClaim(g.cfg.Cluster, peer.Name, peer.Address(), role, started)
	g.mu.Lock()
	defer g.mu.Unlock()
	var ok bool
	why := RejectUnsigned
	switch {
	case sig == nil:
	case peer.Name == g.cfg.Node:
		ok, why = g.cfg.Identity.Public().verify(claim, sig), RejectBadSignature
	default:
		ok, why = g.pinned.verify(peer.Name, claim, sig)
	}
	if ok {
		return nil
	}
	g.reject(alivePrefix+why, peer.Name, "refusing an alive message: its claim to the name at that address is not signed by a key "+
		"pinned for the name (another process holding the pool key, or a member whose key is not pinned)", "node", peer.Name,
		"addr", peer.Address(), "reason", why)
	return fmt.Errorf("%s at %s: %s", peer.Name, peer.Address(), why)
}

// SetPinned replaces the keys signatures are checked against (a changed pinned-keys file: a member
// added or re-keyed). Reports and alive messages already taken stay.
func (g *Gossip) SetPinned(p Pinned) {
	g.mu.Lock()
	g.pinned = p
	g.mu.Unlock()
}

// Member is a live member of the pool as its gossip metadata describes it.
type Member struct {
	Name, Role string
	Started    time.Time
}

// Members returns the live members other than this one, with their roles and start times.
func (g *Gossip) Members() []Member {
	var out []Member
	for _, n := range g.liveNodes() {
		role, started, _ := parseMeta(n.Meta)
		m := Member{Name: n.Name, Role: role}
		if started != 0 {
			m.Started = time.Unix(0, started)
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Started is when this member started.
func (g *Gossip) Started() time.Time { return g.started }

// NotifyMsg takes a report broadcast by a peer and, when it is news, passes it on once (so a report
// reaches every member even when its sender's own retransmissions happen to miss one, at a fraction of
// the packets a full epidemic would cost).
func (d *delegate) NotifyMsg(msg []byte) {
	if len(msg) == 0 {
		return
	}
	now := time.Now()
	msg = slices.Clone(msg)
	r, fresh := (*Gossip)(d).merge(msg)
	if !fresh {
		return
	}
	// A broadcast is at most a few gossip hops old: a fair clock sample (push/pull state is not).
	d.mu.Lock()
	d.clock[r.Node] = clockSample{offset: r.SentAt.Sub(now), at: now}
	d.mu.Unlock()
	if len(msg) <= maxBroadcast {
		d.relay.QueueBroadcast(&reportBroadcast{node: r.Node, msg: msg})
	}
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.relay.GetBroadcasts(overhead, limit)
}

// LocalState is every known report, each length-prefixed, for a push/pull exchange.
func (d *delegate) LocalState(bool) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []byte
	for _, msg := range d.encoded {
		out = binary.AppendUvarint(out, uint64(len(msg)))
		out = append(out, msg...)
	}
	return out
}

func (d *delegate) MergeRemoteState(buf []byte, _ bool) {
	g := (*Gossip)(d)
	for len(buf) > 0 {
		n, k := binary.Uvarint(buf)
		if k <= 0 || n > uint64(len(buf)-k) {
			g.mu.Lock()
			g.reject(RejectUndecodable, "", "dropping an undecodable push/pull state")
			g.mu.Unlock()
			return
		}
		g.merge(slices.Clone(buf[k : k+int(n)]))
		buf = buf[k+int(n):]
	}
}

// events is memberlist's EventDelegate: peer liveness transitions.
type events Gossip

func (e *events) set(n *memberlist.Node, st PeerState) {
	if n.Name == e.cfg.Node {
		return
	}
	e.mu.Lock()
	e.addrs[n.Name] = n.Address()
	if st == PeerAlive {
		cp := *n
		cp.Addr, cp.Meta = slices.Clone(n.Addr), slices.Clone(n.Meta)
		e.nodes[n.Name] = cp
	} else {
		delete(e.nodes, n.Name)
	}
	pv, ok := e.peers[n.Name]
	changed := !ok || pv.State != st
	if changed {
		e.peers[n.Name] = PeerView{Name: n.Name, State: st, Since: time.Now().UTC()}
	}
	e.mu.Unlock()
	if changed && e.cfg.OnPeerChange != nil {
		e.cfg.OnPeerChange()
	}
}

func (e *events) NotifyJoin(n *memberlist.Node)   { e.set(n, PeerAlive) }
func (e *events) NotifyUpdate(n *memberlist.Node) { e.set(n, PeerAlive) }
func (e *events) NotifyLeave(n *memberlist.Node) {
	st := PeerDead
	e.mu.Lock()
	if r, ok := e.reports[n.Name]; ok && r.Leaving {
		st = PeerLeft
	}
	e.mu.Unlock()
	e.set(n, st)
}

// reportBroadcast is one queued report; a newer one of the same node replaces it.
type reportBroadcast struct {
	node string
	msg  []byte
}

func (b *reportBroadcast) Invalidates(other memberlist.Broadcast) bool {
	o, ok := other.(*reportBroadcast)
	return ok && o.node == b.node
}
func (b *reportBroadcast) Message() []byte { return b.msg }
func (b *reportBroadcast) Finished()       {}
