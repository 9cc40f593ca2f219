// Package gossipmux serves the gossip pools of many clusters on one port, for a hub in a management
// cluster: one address (one Service) for the agents of every workload cluster, each cluster's pool
// its own. Every pool already labels its packets and streams with its cluster's name (memberlist's
// label, authenticated by the pool's key), so the mux reads the label of what arrives and hands it,
// unchanged, to the pool of that label, whose memberlist checks the label again. What carries no
// label, or the label of no pool here, is dropped and counted. A pool that does not keep up loses its
// own packets (as a busy network would; memberlist is built for that), never another pool's time.
package gossipmux

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Base is the one socket pair the pools share (health.Transport).
type Base interface {
	memberlist.NodeAwareTransport
}

// Drop reasons, as Dropped counts them.
const (
	DropUnlabelled = "unlabelled"    // carried no label: not a pool of a cell (an agent set up for a self-hosted hub?)
	DropUnknown    = "unknown-label" // a label no pool here has (a cluster not opted in, or its cell not started)
	DropBusy       = "pool-busy"     // the pool's queue was full: its memberlist did not keep up
)

const (
	queue = 256 // packets and streams waiting per pool
	// headerWait bounds the wait for a stream's label; streamWait how long a stream waits for its pool.
	headerWait, streamWait = 5 * time.Second, 5 * time.Second
)

// Mux hands what Base receives to the pools by label.
type Mux struct {
	base Base
	log  *slog.Logger

	mu      sync.Mutex
	pools   map[string]*Pool
	dropped map[string]uint64
	done    chan struct{}
	wg      sync.WaitGroup
}

// New starts handing out what base receives; Shutdown stops it and base.
func New(base Base, log *slog.Logger) *Mux {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Mux{base: base, log: log, pools: map[string]*Pool{}, dropped: map[string]uint64{}, done: make(chan struct{})}
	m.wg.Add(2)
	go m.packets()
	go m.streams()
	return m
}

// Pool is the transport of the pool labelled label (a cluster's gossip name): give it to that pool's
// memberlist (health.GossipConfig.Transport) with the same Cluster. One pool per label.
func (m *Mux) Pool(label string) (*Pool, error) {
	if label == "" || len(label) > memberlist.LabelMaxSize {
		return nil, fmt.Errorf("gossip pool label %q: 1 to %d bytes", label, memberlist.LabelMaxSize)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, taken := m.pools[label]; taken {
		return nil, fmt.Errorf("gossip pool %q is served on this port already: each cluster's pool needs a name of its own", label)
	}
	p := &Pool{m: m, label: label, packets: make(chan *memberlist.Packet, queue), streams: make(chan net.Conn, queue), closed: make(chan struct{})}
	m.pools[label] = p
	return p, nil
}

// Dropped counts what was dropped, by reason.
func (m *Mux) Dropped() map[string]uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]uint64, len(m.dropped))
	for k, v := range m.dropped {
		out[k] = v
	}
	return out
}

// Shutdown closes base, then stops handing out (base's readers end only once what they read was
// taken).
func (m *Mux) Shutdown() error {
	err := m.base.Shutdown()
	close(m.done)
	m.wg.Wait()
	return err
}

func (m *Mux) pool(label string) *Pool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pools[label]
}

func (m *Mux) drop(reason, label string, from net.Addr) {
	m.mu.Lock()
	m.dropped[reason]++
	first := m.dropped[reason] == 1
	m.mu.Unlock()
	if first { // the count says the rest
		m.log.Warn("gossip: dropped what no pool here takes", "reason", reason, "label", label, "from", from.String())
	}
}

func (m *Mux) packets() {
	defer m.wg.Done()
	for {
		var pk *memberlist.Packet
		select {
		case pk = <-m.base.PacketCh():
		case <-m.done:
			return
		}
		_, label, err := memberlist.RemoveLabelHeaderFromPacket(pk.Buf)
		switch p := m.pool(label); {
		case err != nil || label == "":
			m.drop(DropUnlabelled, label, pk.From)
		case p == nil:
			m.drop(DropUnknown, label, pk.From)
		default:
			select {
			case p.packets <- pk: // unchanged: its memberlist checks the label itself
			default:
				m.drop(DropBusy, label, pk.From)
			}
		}
	}
}

func (m *Mux) streams() {
	defer m.wg.Done()
	for {
		select {
		case conn := <-m.base.StreamCh():
			m.wg.Add(1)
			go m.stream(conn) // reading its label may wait: never the next stream's
		case <-m.done:
			return
		}
	}
}

// stream reads conn's label and hands conn, its label put back in front, to that pool.
func (m *Mux) stream(conn net.Conn) {
	defer m.wg.Done()
	_ = conn.SetReadDeadline(time.Now().Add(headerWait))
	rest, label, err := memberlist.RemoveLabelHeaderFromStream(conn)
	_ = conn.SetReadDeadline(time.Time{})
	p := m.pool(label)
	switch {
	case err != nil || label == "":
		m.drop(DropUnlabelled, label, conn.RemoteAddr())
	case p == nil:
		m.drop(DropUnknown, label, conn.RemoteAddr())
	default:
		header, _ := memberlist.AddLabelHeaderToPacket(nil, label)
		select {
		case p.streams <- &labelled{Conn: rest, r: io.MultiReader(bytes.NewReader(header), rest)}:
			return
		case <-p.closed:
		case <-m.done:
		case <-time.After(streamWait):
			m.drop(DropBusy, label, conn.RemoteAddr())
		}
	}
	_ = conn.Close()
}

// labelled is a stream whose first bytes were read to find its pool, and are read again from r.
type labelled struct {
	net.Conn
	r io.Reader
}

func (c *labelled) Read(p []byte) (int, error) { return c.r.Read(p) }

// Pool is one pool's transport on the shared port: what it sends goes out through the mux's socket
// (memberlist labels it), what arrives with its label comes in here.
type Pool struct {
	m       *Mux
	label   string
	packets chan *memberlist.Packet
	streams chan net.Conn
	once    sync.Once
	closed  chan struct{}
}

var _ memberlist.NodeAwareTransport = (*Pool)(nil)

func (p *Pool) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return p.m.base.FinalAdvertiseAddr(ip, port)
}
func (p *Pool) WriteTo(b []byte, addr string) (time.Time, error) { return p.m.base.WriteTo(b, addr) }
func (p *Pool) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return p.m.base.WriteToAddress(b, a)
}
func (p *Pool) PacketCh() <-chan *memberlist.Packet { return p.packets }
func (p *Pool) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return p.m.base.DialTimeout(addr, timeout)
}
func (p *Pool) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return p.m.base.DialAddressTimeout(a, timeout)
}
func (p *Pool) StreamCh() <-chan net.Conn { return p.streams }

// Shutdown takes the pool off the port (its label is free again); the port stays for the others.
func (p *Pool) Shutdown() error {
	p.once.Do(func() {
		p.m.mu.Lock()
		if p.m.pools[p.label] == p {
			delete(p.m.pools, p.label)
		}
		p.m.mu.Unlock()
		close(p.closed)
	})
	return nil
}
