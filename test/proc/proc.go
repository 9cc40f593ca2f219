// Package proc runs the real programs a test needs (etcd, the agent and hub binaries, an operator, a
// controller manager, a program inside a network namespace) as child processes: output kept (in memory
// or a file) and shown when the test fails, killed when the test ends, signalled as a crash or a hang,
// and waited for until a health endpoint answers. Every test that starts a binary starts it here.
package proc

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// TB is what Start needs of its caller: a test's testing.TB, or a harness's own (a chaos run's).
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	Failed() bool
}

// Options change how a process is run.
type Options struct {
	// Log is a file the output is appended to (kept for after the test); empty keeps it in memory.
	Log string
	// Group starts the process in a process group of its own; signals reach the whole group (a
	// program run through a launcher such as `ip netns exec`, and what it forks).
	Group bool
	// Args is the command line as the caller sees it (what Args returns, to start it again) when cmd
	// wraps it in a launcher; by default cmd's own.
	Args []string
}

// Process is a running child process.
type Process struct {
	name string
	args []string
	cmd  *exec.Cmd
	o    Options
	done chan struct{}

	mu   sync.Mutex
	logs bytes.Buffer
}

// Start starts cmd as name, its output kept in memory; it is killed when the test ends, and the last
// 200 lines of its output are logged if the test failed.
func Start(t TB, name string, cmd *exec.Cmd) *Process {
	t.Helper()
	return StartWith(t, name, cmd, Options{})
}

// StartWith is Start with options.
func StartWith(t TB, name string, cmd *exec.Cmd, o Options) *Process {
	t.Helper()
	p := &Process{name: name, args: o.Args, cmd: cmd, o: o, done: make(chan struct{})}
	if p.args == nil {
		p.args = cmd.Args
	}
	var f *os.File
	if o.Log != "" {
		var err error
		if f, err = os.OpenFile(o.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			t.Fatalf("starting %s: its log: %v", name, err)
		}
		cmd.Stdout, cmd.Stderr = f, f
	} else {
		cmd.Stdout, cmd.Stderr = p, p
	}
	if o.Group {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		if f != nil {
			f.Close()
		}
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		_ = cmd.Wait()
		if f != nil {
			f.Close()
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s:\n%s", name, p.Tail(200))
		}
	})
	return p
}

// Name is the name it was started as.
func (p *Process) Name() string { return p.name }

// Args is the command line it was started with (to start it again).
func (p *Process) Args() []string { return append([]string(nil), p.args...) }

// Pid is the process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Running reports whether the process has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process, or to its group (Options.Group): SIGSTOP and SIGCONT for a process
// that hangs and comes back, SIGKILL for a crash that is not waited for.
func (p *Process) Signal(sig syscall.Signal) {
	if p.o.Group {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
		return
	}
	_ = p.cmd.Process.Signal(sig)
}

// Kill kills the process (SIGKILL, as a crash) and waits until it has exited.
func (p *Process) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop asks the process to stop (SIGTERM), and kills it after timeout.
func (p *Process) Stop(timeout time.Duration) {
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.Kill()
	}
}

// Write keeps the process's output (when it is kept in memory).
func (p *Process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

// Logs is everything the process printed so far.
func (p *Process) Logs() string {
	if p.o.Log != "" {
		b, _ := os.ReadFile(p.o.Log)
		return string(b)
	}
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
func (p *Process) WaitReady(t TB, url string, timeout time.Duration) {
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
func FreePort(t TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return port
}

// FreeAddr is FreePort's 127.0.0.1:PORT, for a helper without a test (a member restarted on its own
// ports after a while away must find them still free: test/etcdcluster).
func FreeAddr() (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

func freePort() (int, error) {
	for range portSpan {
		port := portBase + int(nextPort.Add(1)%portSpan)
		if free(port) {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port in %d–%d", portBase, portBase+portSpan-1)
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

// Build builds the commands of this module named by pkgs (keys: output paths; values: "./cmd/hub"
// and the like) as the image does (deploy/image/build-binaries: static, -trimpath), from anywhere
// inside the module. Built that way they share their compiled packages with test/run's static build
// and the programs test/kube builds, instead of compiling every dependency again.
func Build(pkgs map[string]string) error {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return fmt.Errorf("finding the module (run from the repository): %w", err)
	}
	for out, pkg := range pkgs {
		cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
		cmd.Dir = strings.TrimSpace(string(root))
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %w\n%s", pkg, err, msg)
		}
	}
	return nil
}
