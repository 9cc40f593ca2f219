package silent

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Proxy forwards TCP connections on 127.0.0.1 to a server until it is frozen: then nothing passes
// either way (a server that hangs, or a partition that drops every packet: what is sent waits, as
// TCP retransmits it), until it thaws and what waited goes through.
type Proxy struct {
	ln     net.Listener
	mu     sync.Mutex
	thawed chan struct{} // closed while traffic passes
}

// Forward starts a Proxy to target (host:port); it and its connections end when the test does.
func Forward(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{ln: ln, thawed: make(chan struct{})}
	close(p.thawed)
	Join(t, ln, func(ctx context.Context) (net.Conn, error) {
		if !p.pass(ctx) {
			return nil, ctx.Err()
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", target)
	}, p.copy)
	return p
}

// Join accepts connections on ln until t ends, and joins each to one that dial makes, copying each
// way with copy (io.Copy when nil). Either side's end (or the test's) ends both: a peer that closes
// is gone.
func Join(t testing.TB, ln net.Listener, dial func(context.Context) (net.Conn, error), copy func(ctx context.Context, dst, src net.Conn)) {
	if copy == nil {
		copy = func(_ context.Context, dst, src net.Conn) { _, _ = io.Copy(dst, src) }
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer in.Close()
				out, err := dial(ctx)
				if err != nil {
					return
				}
				defer out.Close()
				stop := context.AfterFunc(ctx, func() { in.Close(); out.Close() })
				defer stop()
				done := make(chan struct{})
				go func() {
					defer close(done)
					copy(ctx, out, in)
					in.Close()
					out.Close()
				}()
				copy(ctx, in, out)
				in.Close()
				out.Close()
				<-done
			})
		}
	})
}

// Addr is host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Freeze stops all traffic, Thaw lets it through again.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
		p.thawed = make(chan struct{})
	default:
	}
}

func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
	default:
		close(p.thawed)
	}
}

// pass waits until traffic may pass; false when ctx ended first.
func (p *Proxy) pass(ctx context.Context) bool {
	p.mu.Lock()
	thawed := p.thawed
	p.mu.Unlock()
	select {
	case <-thawed:
		return true
	case <-ctx.Done():
		return false
	}
}

// copy copies src to dst, each chunk once traffic may pass, until either ends.
func (p *Proxy) copy(ctx context.Context, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass(ctx) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
