package health

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// ReconnectTimeout is how long a peer that died (not one that left) is joined again: after a day it is
// taken for gone for good. Peers named with KeepJoined are joined again for as long as they are named.
const ReconnectTimeout = 24 * time.Hour

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

// RejoinEvery is how often a member that has joined the pool joins again the listed peers that are
// not in it: memberlist never reaches out to a node it does not know, so two pools that formed apart
// (a hub that joined only a witness that was up first, agents that found each other through etcd
// meanwhile: seen on a real cluster) would stay apart for good.
const RejoinEvery = 10 * time.Second

// JoinLoop joins the peers peers() lists, retrying with backoff (1 s doubling to 30 s) until one
// answers, and then every RejoinEvery joins those it lists that are not live members of the pool,
// until ctx ends. At boot the peers may not be up yet, nor known: peers() is asked again each time (it
// may list what the node learns meanwhile, such as etcd's members or the cluster's Nodes).
func (g *Gossip) JoinLoop(ctx context.Context, peers func() []string) {
	wait, joined := time.Second, false
	for {
		list := peers()
		if joined {
			list = g.outside(list)
		}
		switch n, err := g.join(list); {
		case len(list) == 0 && !joined:
			g.log.Info("no peer to join known yet; will look again", "in", wait)
		case len(list) == 0:
		case err == nil && !joined:
			g.log.Info("joined the gossip pool", "answered", n)
			joined, wait = true, g.rejoin
		case err == nil:
			g.log.Info("joined peers that were outside the gossip pool", "peers", list, "answered", n)
		case !joined:
			g.log.Warn("joining the gossip pool; will retry", "err", err, "in", wait)
		default:
			g.log.Debug("peers outside the gossip pool do not answer", "peers", list, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if !joined {
			wait = min(2*wait, 30*time.Second)
		}
	}
}

func (g *Gossip) join(peers []string) (int, error) {
	if len(peers) == 0 {
		return 0, nil
	}
	return g.Join(peers)
}

// outside are the peers (host:port) that are not the address of a live member of the pool (a name
// to resolve is never one: it is joined again each time). The live members are the copies made in
// memberlist's callbacks (nodes): the nodes memberlist's Members returns are its own, which it
// changes under its lock as members come back (a data race, seen under -race).
func (g *Gossip) outside(peers []string) []string {
	live := map[string]bool{}
	g.mu.Lock()
	for _, n := range g.nodes {
		live[n.Address()] = true
	}
	g.mu.Unlock()
	var out []string
	for _, p := range peers {
		if !live[p] {
			out = append(out, p)
		}
	}
	return out
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

// earlierIncarnation says whether r is from an earlier run of its member than the one alive in the pool
// now: the member's gossip meta says when it started, and so does each report it sends, both on its own
// clock. Callers hold g.mu.
func (g *Gossip) earlierIncarnation(r Report) bool {
	n, alive := g.nodes[r.Node]
	if !alive || r.Started.IsZero() {
		return false
	}
	_, started, _ := parseMeta(n.Meta)
	return started != 0 && r.Started.UnixNano() < started
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
		if r, ok := e.reports[n.Name]; ok && (*Gossip)(e).earlierIncarnation(*r) {
			// The report held is from before the member started again (its machine rebooted, its
			// agent restarted): it says nothing of the member now, and must not pass for its newest
			// until the new one comes (a hub took a rebooted machine's last report, 15 s old, for a
			// view of etcd now, and its old cluster for the current one).
			delete(e.reports, n.Name)
			delete(e.encoded, n.Name)
		}
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

func (e *events) NotifyJoin(n *memberlist.Node) { e.set(n, PeerAlive) }

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
