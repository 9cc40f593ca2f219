// Package silent is a TCP server that accepts connections and never answers: a hung API server or
// BMC (its machine froze with its network stack still up), for tests; a proxy (Forward) that goes
// silent on demand, between a client and a server that go on; and the joining of accepted
// connections to dialled ones that the proxy is made of (Join).
package silent

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Server accepts on 127.0.0.1 and holds every connection open, unanswered, until the test ends.
type Server struct {
	ln       net.Listener
	accepted atomic.Int32
}

// Listen starts a Server; it and its connections are closed when the test ends.
func Listen(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &Server{ln: ln}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return s
}

// Addr is host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Accepted counts the connections accepted.
func (s *Server) Accepted() int { return int(s.accepted.Load()) }
