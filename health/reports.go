package health

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"maps"
	"time"

	"github.com/hale-dev/hale/health/identity"
	"github.com/hashicorp/memberlist"
)

// clockSample is a peer's clock offset (its send time minus our receive time) and when it was taken.
type clockSample struct {
	offset time.Duration
	at     time.Time
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
	msg, err := encodeReport(&r, g.zw)
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
		identity.RejectUnsigned, identity.RejectUnknownNode, identity.RejectBadSignature,
		alivePrefix + identity.RejectUnsigned, alivePrefix + identity.RejectUnknownNode, alivePrefix + identity.RejectBadSignature}
}

// MaxAhead is how far ahead of this member's clock a report's version and send time may be. The
// clock probe already fails a node off by more than half a second.
const MaxAhead = time.Minute

// reject counts a rejected message and says why, once per kind and node. Called with g.mu held.
func (g *Gossip) reject(reason, node, msg string, args ...any) {
	g.rejected[reason]++
	g.dedup.Once(reason, node, msg, args...)
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
	out[RejectUndecryptable] = g.dedup.Undecryptable()
	return out
}

// merge keeps the report in msg if it is newer than what is known of its node, and says so.
func (g *Gossip) merge(msg []byte) (*Report, bool) {
	r, fresh := g.admit(msg)
	if fresh && r.Leaving {
		g.leftAfterAll(r.Node)
	}
	return r, fresh
}

// leftAfterAll records as left a peer already recorded dead whose last report, marked Leaving, came in
// after memberlist's word that it is gone: the two travel separately, and on a busy machine the leave
// can come first.
func (g *Gossip) leftAfterAll(node string) {
	g.mu.Lock()
	pv, ok := g.peers[node]
	changed := ok && pv.State == PeerDead
	if changed {
		pv.State = PeerLeft
		g.peers[node] = pv
	}
	g.mu.Unlock()
	if changed && g.cfg.OnPeerChange != nil {
		g.cfg.OnPeerChange()
	}
}

// admit is merge's check and store.
func (g *Gossip) admit(msg []byte) (*Report, bool) {
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
		if verified, why = pinned.Verify(r.Node, inner, sig); !signed {
			verified, why = false, identity.RejectUnsigned
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
	case g.earlierIncarnation(*r):
		return nil, false // from before its member started again, still passed on by a peer
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

func (b *reportBroadcast) Finished() {}
