package health

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hale-dev/hale/health/identity"
	"github.com/hashicorp/memberlist"
)

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
			sig := d.cfg.Identity.Sign(identity.AliveClaim(d.cfg.Cluster, d.cfg.Node, addr, d.cfg.Role, started))
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
	claim := identity.AliveClaim(g.cfg.Cluster, peer.Name, peer.Address(), role, started)
	g.mu.Lock()
	defer g.mu.Unlock()
	var ok bool
	why := identity.RejectUnsigned
	switch {
	case sig == nil:
	case peer.Name == g.cfg.Node:
		ok, why = g.cfg.Identity.Public().Verify(claim, sig), identity.RejectBadSignature
	default:
		ok, why = g.pinned.Verify(peer.Name, claim, sig)
	}
	if ok {
		return nil
	}
	g.reject(alivePrefix+why, peer.Name, "refusing an alive message: its claim to the name at that address is not signed by a key "+
		"pinned for the name (another process holding the pool key, or a member whose key is not pinned)", "node", peer.Name,
		"addr", peer.Address(), "reason", why)
	return fmt.Errorf("%s at %s: %s", peer.Name, peer.Address(), why)
}

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
