// Package proc runs a real program a test needs (an operator, a controller manager) as a child
// process: its output kept and shown when the test fails, killed when the test ends, and waited for
// until its health endpoint answers.
package proc

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Process is a running child process.
type Process struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
}

// Start starts cmd (its output captured) as name; it is killed when the test ends, and the last 200
// lines of its output are logged if the test failed.
func Start(t testing.TB, name string, cmd *exec.Cmd) *Process {
	t.Helper()
	p := &Process{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p, p
	require.NoError(t, cmd.Start(), "starting %s", name)
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s:\n%s", name, p.Tail(200))
		}
	})
	return p
}

// Kill kills the process (SIGKILL, as a crash) and waits until it has exited.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Signal sends sig to the process (SIGSTOP and SIGCONT: a process that hangs and comes back).
func (p *Process) Signal(sig os.Signal) { _ = p.cmd.Process.Signal(sig) }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Write keeps the process's output.
func (p *Process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

// Logs is everything the process printed so far.
func (p *Process) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// Tail is the last n lines of Logs.
func (p *Process) Tail(n int) string {
	lines := strings.Split(p.Logs(), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// WaitReady polls url until it answers 200 OK; the test fails if the process exits first or timeout
// passes.
func (p *Process) WaitReady(t testing.TB, url string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited:\n%s", p.name, p.Tail(100))
		case <-ctx.Done():
			t.Fatalf("%s not ready in %v:\n%s", p.name, timeout, p.Tail(100))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// FreePort is a port on 127.0.0.1, free for TCP and UDP when it was picked, for a process the test
// starts to listen on.
//
// Ports are handed out in turn from below the kernel's ephemeral range (32768–60999 by default), each
// at most once per test binary: a port taken from the ephemeral range with a listen on :0 and closed
// again can be given to another process's connection, or to the next such pick, before the child
// binds it ("bind: address already in use").
func FreePort(t testing.TB) int {
	t.Helper()
	for range portSpan {
		port := portBase + int(nextPort.Add(1)%portSpan)
		if free(port) {
			return port
		}
	}
	t.Fatalf("no free port in %d–%d", portBase, portBase+portSpan-1)
	return 0
}

const portBase, portSpan = 20000, 12000

// nextPort is the last port handed out, less portBase; it starts at a place of its own in each test
// binary (packages' tests run side by side). Package state, as the kernel's port table is.
var nextPort = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(int64(os.Getpid()*509) % portSpan)
	return &n
}()

func free(port int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	return u.Close() == nil
}
