// Package partition cuts gossip links between members of a pool that runs in one process (the demo
// topology): a memberlist transport that drops the UDP packets and refuses the TCP connections between
// members on opposite sides of a cut, both ways. Process-level tests cut real links with iptables in
// network namespaces instead (test/netns, test/lab).
package partition

import (
	"errors"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Network knows every member's gossip address by name, and which pairs are cut.
type Network struct {
	mu    sync.Mutex
	addrs map[string]string // name → host:port
	cut   map[[2]string]bool
}

// New returns a network with nothing cut.
func New() *Network { return &Network{addrs: map[string]string{}, cut: map[[2]string]bool{}} }

// Cut separates every member of a from every member of b (by name), both ways, until Heal.
func (n *Network) Cut(a, b []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			n.cut[[2]string{x, y}], n.cut[[2]string{y, x}] = true, true
		}
	}
}

// Heal joins everything again.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
}

func (n *Network) blocked(from, to string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	var fromName, toName string
	for name, a := range n.addrs {
		switch a {
		case from:
			fromName = name
		case to:
			toName = name
		}
	}
	return n.cut[[2]string{fromName, toName}]
}

// Transport is one member's transport on the network.
type Transport struct {
	memberlist.NodeAwareTransport
	net  *Network
	self string
	in   chan *memberlist.Packet
}

// errCut is what a dial across a cut gets.
var errCut = errors.New("partitioned (test/partition)")

// Wrap puts inner, the transport of member name listening at self (host:port), on the network.
func (n *Network) Wrap(name, self string, inner memberlist.NodeAwareTransport) *Transport {
	n.mu.Lock()
	n.addrs[name] = self
	n.mu.Unlock()
	t := &Transport{NodeAwareTransport: inner, net: n, self: self, in: make(chan *memberlist.Packet, 256)}
	go func() {
		for p := range inner.PacketCh() {
			if !n.blocked(p.From.String(), self) {
				t.in <- p
			}
		}
	}()
	return t
}

// Members returns the names registered, sorted.
func (n *Network) Members() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for name := range n.addrs {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// PacketCh returns the packets not sent across a cut.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.in }

// WriteTo sends b unless addr is across a cut (then it is lost, as on a cut link).
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.net.blocked(t.self, addr) {
		return time.Now(), nil
	}
	return t.NodeAwareTransport.WriteTo(b, addr)
}

// WriteToAddress is WriteTo for an address.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.net.blocked(t.self, a.Addr) {
		return time.Now(), nil
	}
	return t.NodeAwareTransport.WriteToAddress(b, a)
}

// DialTimeout connects unless addr is across a cut.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.net.blocked(t.self, addr) {
		time.Sleep(min(timeout, 100*time.Millisecond)) // a cut link answers nothing
		return nil, errCut
	}
	return t.NodeAwareTransport.DialTimeout(addr, timeout)
}

// DialAddressTimeout is DialTimeout for an address.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}
