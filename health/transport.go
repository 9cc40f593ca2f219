package health

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

// Transport is memberlist's network transport (UDP packets, TCP streams on one port) with one change
// that matters on an idle control-plane node: memberlist's NetTransport reads every UDP packet into a
// fresh 64 KiB buffer, and at our timing (a probe every 100 ms, a report to every peer every second)
// that garbage was the largest item in the agent's idle CPU profile, the collector's work the next.
// This one reads into a buffer it reuses and hands memberlist a copy of the packet's own bytes (a few
// hundred), and sends to IP addresses without resolving them again each time.
type Transport struct {
	log     *slog.Logger
	bind    net.IP
	tcp     *net.TCPListener
	udp     *net.UDPConn
	packets chan *memberlist.Packet
	streams chan net.Conn
	closed  atomic.Bool
	wg      sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

const (
	maxPacket  = 65536           // the largest UDP datagram
	udpRecvBuf = 2 * 1024 * 1024 // as memberlist asks of the kernel, halved until it accepts
)

// NewTransport listens on bindAddr:port for both UDP and TCP (port 0: a free port, the same for both).
func NewTransport(bindAddr string, port int, log *slog.Logger) (*Transport, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ip := net.ParseIP(bindAddr)
	if bindAddr == "" {
		ip = net.IPv4zero
	} else if ip == nil {
		return nil, fmt.Errorf("gossip bind address %q is not an IP address", bindAddr)
	}
	t := &Transport{log: log, bind: ip, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn)}
	var err error
	if t.tcp, err = net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port}); err != nil {
		return nil, fmt.Errorf("gossip: listening on TCP %s: %w", net.JoinHostPort(bindAddr, fmt.Sprint(port)), err)
	}
	port = t.tcp.Addr().(*net.TCPAddr).Port
	if t.udp, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port}); err != nil {
		_ = t.tcp.Close()
		return nil, fmt.Errorf("gossip: listening on UDP %s: %w", net.JoinHostPort(bindAddr, fmt.Sprint(port)), err)
	}
	for size := udpRecvBuf; size > 0; size /= 2 {
		if t.udp.SetReadBuffer(size) == nil {
			break
		}
	}
	t.wg.Add(2)
	go t.acceptStreams()
	go t.readPackets()
	return t, nil
}

// Port is the port it listens on.
func (t *Transport) Port() int { return t.tcp.Addr().(*net.TCPAddr).Port }

// FinalAdvertiseAddr is the address peers reach this member at: the one configured, else the bind
// address, else (bound to all interfaces) the first private address; the port is the bound one unless
// another was configured.
func (t *Transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if port == 0 {
		port = t.Port()
	}
	if ip != "" {
		a := net.ParseIP(ip)
		if a == nil {
			return nil, 0, fmt.Errorf("gossip advertise address %q is not an IP address", ip)
		}
		if a4 := a.To4(); a4 != nil {
			a = a4
		}
		return a, port, nil
	}
	if !t.bind.IsUnspecified() {
		return t.bind, port, nil
	}
	private, err := sockaddr.GetPrivateIP()
	if err != nil || private == "" {
		return nil, 0, fmt.Errorf("gossip is bound to all interfaces and no private address was found (%v): give an advertise address", err)
	}
	return net.ParseIP(private), port, nil
}

// WriteTo sends b to addr (host:port) in one UDP packet.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		_, err = t.udp.WriteToUDPAddrPort(b, ap)
		return time.Now(), err
	}
	ua, err := net.ResolveUDPAddr("udp", addr) // a host name
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.udp.WriteTo(b, ua)
	return time.Now(), err
}

// WriteToAddress is WriteTo.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

// PacketCh delivers the packets received.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout opens a stream to addr.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return (&net.Dialer{Timeout: timeout}).Dial("tcp", addr)
}

// DialAddressTimeout is DialTimeout.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

// StreamCh delivers the streams peers opened.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes both sockets and waits for the readers to end.
func (t *Transport) Shutdown() error {
	t.closed.Store(true)
	err := errors.Join(t.tcp.Close(), t.udp.Close())
	t.wg.Wait()
	return err
}

func (t *Transport) acceptStreams() {
	defer t.wg.Done()
	backoff := time.Duration(0)
	for {
		conn, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.closed.Load() {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			t.log.Warn("gossip: accepting a stream", "err", err, "retry in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		t.streams <- conn
	}
}

func (t *Transport) readPackets() {
	defer t.wg.Done()
	buf := make([]byte, maxPacket)
	for {
		n, from, err := t.udp.ReadFromUDPAddrPort(buf)
		now := time.Now() // as close to the read as it gets: memberlist measures probe round trips with it
		if err != nil {
			if t.closed.Load() {
				return
			}
			t.log.Warn("gossip: reading a packet", "err", err)
			continue
		}
		if n == 0 {
			continue
		}
		// Unmapped: a socket bound to all interfaces is dual-stack, and an IPv4 peer must look the same
		// as on an IPv4 socket (memberlist answers pings at the address it prints).
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		t.packets <- &memberlist.Packet{Buf: append([]byte(nil), buf[:n]...), From: net.UDPAddrFromAddrPort(from), Timestamp: now}
	}
}
