// Package netns is a lab of hosts on one machine: each host a network namespace with its own address
// on a bridge (the bridge in a namespace of its own, so that nothing touches the machine's network),
// real processes started inside them, and real network faults (iptables DROP rules inside the hosts'
// namespaces: partitions, one-way drops). It needs root, `ip` (iproute2) and `iptables`.
//
// Everything it makes is named halet-PID-N-… (N: the process's Nth lab): a lab removes what it made
// when it closes, and on start whatever an earlier lab left behind whose process is gone (a test
// killed mid-run). Labs side by side each have a bridge of their own: the same addresses never meet.
package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hale-dev/hale/test/proc"
)

const prefix = "halet-"

// labs counts the labs this process made: labs side by side (parallel chaos runs) have names of their
// own. Package state, as the kernel's namespace names are.
var labs atomic.Int64

// TB is what a lab needs of its user: a test's testing.TB, or the chaos harness's run.
type TB interface {
	proc.TB
	Errorf(format string, args ...any)
	TempDir() string
}

// Lab is a set of hosts on one bridge.
type Lab struct {
	t      TB
	id     string // halet-PID
	sw     string // the switch namespace, holding the bridge
	dir    string // process logs
	mu     sync.Mutex
	hosts  []*Host
	closed bool
	onRule func(h *Host, args []string)
}

// OnRule has f called after each iptables rule the lab applies in a host (its arguments after -w), as
// it applies them: a cut's or a heal's once every host has its rules (each host's at once, the hosts
// side by side), other rules one at a time; whoever judges what the network carried must see them in
// that order.
func (l *Lab) OnRule(f func(h *Host, args []string)) {
	l.mu.Lock()
	l.onRule = f
	l.mu.Unlock()
}

// Host is one namespace with one address.
type Host struct {
	Name string
	NS   string
	IP   string
	lab  *Lab
}

// Available says why a lab cannot run here, or "" when it can: root, ip and iptables.
func Available() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	for _, tool := range []string{"ip", "iptables", "iptables-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("%s is not on PATH (Debian: apt-get install iproute2 iptables; test/run installs it)", tool)
		}
	}
	return ""
}

// New makes an empty lab (the bridge), removing first what dead earlier labs left behind. It is
// closed when the test ends.
func New(t TB) *Lab {
	t.Helper()
	if why := Available(); why != "" {
		t.Fatalf("netns lab: %s", why)
	}
	removeLeftovers(t)
	l := &Lab{t: t, id: fmt.Sprintf("%s%d-%d", prefix, os.Getpid(), labs.Add(1)), dir: t.TempDir()}
	l.sw = l.id + "-sw"
	t.Cleanup(l.Close)
	l.must("ip", "netns", "add", l.sw)
	l.must("ip", "-n", l.sw, "link", "add", "br0", "type", "bridge")
	l.must("ip", "-n", l.sw, "link", "set", "br0", "up")
	return l
}

// removeLeftovers deletes the namespaces of labs whose process is gone.
func removeLeftovers(t TB) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		pid, _, ok := strings.Cut(strings.TrimPrefix(name, prefix), "-")
		if !strings.HasPrefix(name, prefix) || !ok {
			continue
		}
		if n, err := strconv.Atoi(pid); err == nil {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", n)); err == nil {
				continue // a lab still running
			}
		}
		killIn(name)
		_ = exec.Command("ip", "netns", "del", name).Run()
		t.Logf("netns lab: removed %s, left behind by an earlier run", name)
	}
}

// killIn kills every process in namespace ns.
func killIn(ns string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func (l *Lab) must(args ...string) string {
	l.t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		l.t.Fatalf("netns lab: %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Host adds a host named name at 10.77.0.(10+n), n the count of hosts before it.
func (l *Lab) Host(name string) *Host {
	l.t.Helper()
	l.mu.Lock()
	n := len(l.hosts)
	h := &Host{Name: name, NS: fmt.Sprintf("%s-%d", l.id, n), IP: fmt.Sprintf("10.77.0.%d", 10+n), lab: l}
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()
	veth := fmt.Sprintf("v%d", n)
	l.must("ip", "netns", "add", h.NS)
	l.must("ip", "-n", l.sw, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", h.NS)
	l.must("ip", "-n", l.sw, "link", "set", veth, "master", "br0", "up")
	l.must("ip", "-n", h.NS, "addr", "add", h.IP+"/24", "dev", "eth0")
	l.must("ip", "-n", h.NS, "link", "set", "eth0", "up")
	l.must("ip", "-n", h.NS, "link", "set", "lo", "up")
	return h
}

// Addr is host:port on this host.
func (h *Host) Addr(port int) string { return fmt.Sprintf("%s:%d", h.IP, port) }

// Run runs a command inside the host to completion and returns its combined output.
func (h *Host) Run(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", h.NS}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s on %s: %w: %s", strings.Join(args, " "), h.Name, err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// Do runs f on an OS thread switched into the host's network namespace, so that the sockets f makes
// (a listener, a dialled connection) belong to the host: the harness's own servers and clients join
// the lab without a process of their own. The thread switches back afterwards. (Ending the thread
// instead would be simpler, but a thread's end signals the children it forked with Pdeathsig set,
// such as ipmisim's ipmi_sim.)
func (h *Host) Do(f func() error) error {
	runtime.LockOSThread()
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns lab: this thread's namespace: %w", err)
	}
	defer own.Close()
	ns, err := os.Open(filepath.Join("/var/run/netns", h.NS))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns lab: host %s: %w", h.Name, err)
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns lab: entering host %s: %w", h.Name, err)
	}
	ferr := f()
	if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
		// Stay locked: the goroutine's end then ends the thread rather than let Go reuse it in the
		// host's namespace.
		return errors.Join(ferr, fmt.Errorf("netns lab: leaving host %s: %w", h.Name, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// Dial connects from inside the host (for http.Transport.DialContext and the like).
func (h *Host) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := h.Do(func() (err error) {
		var d net.Dialer
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// Listen listens inside the host.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// Start starts a process inside the host (in a process group of its own), its output appended to
// name.log in the lab's directory. It is killed when the test ends, before the lab closes.
func (h *Host) Start(name string, args ...string) *proc.Process {
	l := h.lab
	l.t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", h.NS}, args...)...)
	return proc.StartWith(l.t, name, cmd, proc.Options{Log: filepath.Join(l.dir, name+".log"), Group: true, Args: args})
}

// Cut drops every packet between each host of a and each host of b, both ways (rules in a's and b's
// namespaces), until Heal.
func (l *Lab) Cut(a, b []*Host) {
	l.t.Helper()
	l.drops("-A", a, b)
}

// CutSilently is Cut with the packets dropped as they arrive only: a sender's writes succeed and go
// unanswered, as a switch or a peer's firewall loses them. Cut drops them as they leave too, and a
// sender's own OUTPUT rule fails its writes at once (EPERM), which a TCP stack notices sooner.
func (l *Lab) CutSilently(a, b []*Host) {
	l.t.Helper()
	l.drops("-A", a, b, "INPUT")
}

// drops appends (-A) or deletes (-D) the DROP rules between each host of a and each of b, both ways,
// in the chains given (INPUT and OUTPUT if none): each host's rules in one iptables-restore, every
// host's at the same time, as a switch that fails or comes back changes every link at once. (With one
// iptables command a rule, a partition of two hosts from four took 64 commands, and up to 10 s on a
// loaded machine: the hub's links came back first, and the hub, hearing every observer again, healed
// as failing a machine still cut off from its etcd peers; test/chaos minority-hub, 2026-12-04.)
func (l *Lab) drops(action string, a, b []*Host, chains ...string) {
	l.t.Helper()
	if len(chains) == 0 {
		chains = []string{"INPUT", "OUTPUT"}
	}
	rules := map[*Host][][]string{}
	var hosts []*Host
	for _, x := range a {
		for _, y := range b {
			for _, pair := range [][2]*Host{{x, y}, {y, x}} {
				for _, chain := range chains {
					match := "-s"
					if chain == "OUTPUT" {
						match = "-d"
					}
					if _, ok := rules[pair[0]]; !ok {
						hosts = append(hosts, pair[0])
					}
					rules[pair[0]] = append(rules[pair[0]], []string{action, chain, match, pair[1].IP, "-j", "DROP"})
				}
			}
		}
	}
	applied, errs := make([][][]string, len(hosts)), make([]error, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Go(func() {
			applied[i] = rules[h]
			if action == "-D" {
				applied[i], errs[i] = standing(h, rules[h]) // CutSilently made no OUTPUT rules
			}
			if errs[i] == nil {
				errs[i] = restore(h, applied[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		l.t.Fatalf("netns lab: %v", err)
	}
	for i, h := range hosts {
		l.told(h, applied[i]...)
	}
}

// standing keeps of the deletions dels those whose rule stands in h (as many times as it stands).
func standing(h *Host, dels [][]string) ([][]string, error) {
	out, err := h.Run("iptables", "-w", "-S")
	if err != nil {
		return nil, err
	}
	count := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		count[strings.TrimSpace(line)]++
	}
	var keep [][]string
	for _, d := range dels {
		// as -S prints it: "-A INPUT -s 10.0.0.2/32 -j DROP"
		k := fmt.Sprintf("-A %s %s %s/32 -j DROP", d[1], d[2], d[3])
		if count[k] > 0 {
			count[k]--
			keep = append(keep, d)
		}
	}
	return keep, nil
}

// restore applies rules (each an iptables command's arguments, its action first) in h's filter table
// at once.
func restore(h *Host, rules [][]string) error {
	if len(rules) == 0 {
		return nil
	}
	var script strings.Builder
	script.WriteString("*filter\n")
	for _, r := range rules {
		script.WriteString(strings.Join(r, " ") + "\n")
	}
	script.WriteString("COMMIT\n")
	cmd := exec.Command("ip", "netns", "exec", h.NS, "iptables-restore", "-w", "--noflush")
	cmd.Stdin = strings.NewReader(script.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore on %s: %w: %s\n%s", h.Name, err, bytes.TrimSpace(out), script.String())
	}
	return nil
}

// Drop drops packets from each host of from to each host of to (one way), each with probability p
// (1: all of them; below 1, iptables' statistic match: loss), until Undrop with the same arguments or
// Heal. The rules sit in the senders' OUTPUT chains.
func (l *Lab) Drop(from, to []*Host, p float64) {
	l.t.Helper()
	l.oneWay("-A", from, to, p)
}

// Undrop removes the rules Drop(from, to, p) made.
func (l *Lab) Undrop(from, to []*Host, p float64) {
	l.t.Helper()
	l.oneWay("-D", from, to, p)
}

func (l *Lab) oneWay(action string, from, to []*Host, p float64) {
	l.t.Helper()
	for _, x := range from {
		for _, y := range to {
			rule := []string{action, "OUTPUT", "-d", y.IP}
			if p < 1 {
				rule = append(rule, "-m", "statistic", "--mode", "random", "--probability", strconv.FormatFloat(p, 'f', 3, 64))
			}
			l.iptables(x, append(rule, "-j", "DROP")...)
		}
	}
}

// Isolate drops every packet in and out of h but its loopback's (a machine frozen whole: a VM stun, a
// hung kernel), until Unisolate or Heal.
func (l *Lab) Isolate(h *Host) {
	l.t.Helper()
	l.isolation(h, "-I")
}

// Unisolate removes the rules Isolate(h) made.
func (l *Lab) Unisolate(h *Host) {
	l.t.Helper()
	l.isolation(h, "-D")
}

func (l *Lab) isolation(h *Host, action string) {
	l.t.Helper()
	l.iptables(h, action, "INPUT", "!", "-i", "lo", "-j", "DROP")
	l.iptables(h, action, "OUTPUT", "!", "-o", "lo", "-j", "DROP")
}

// Hosts are the lab's hosts, in the order they were added.
func (l *Lab) Hosts() []*Host {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.hosts)
}

// Uncut removes the rules Cut(a, b) or CutSilently(a, b) made (or with b, a): those links carry packets
// again.
func (l *Lab) Uncut(a, b []*Host) {
	l.t.Helper()
	l.drops("-D", a, b)
}

// Heal removes every rule Cut, CutSilently and Drop made.
func (l *Lab) Heal() {
	l.t.Helper()
	l.mu.Lock()
	hosts := slices.Clone(l.hosts)
	l.mu.Unlock()
	for _, h := range hosts {
		l.iptables(h, "-F", "INPUT")
		l.iptables(h, "-F", "OUTPUT")
	}
}

func (l *Lab) iptables(h *Host, args ...string) {
	l.t.Helper()
	if out, err := h.Run(append([]string{"iptables", "-w"}, args...)...); err != nil {
		l.t.Fatalf("netns lab: %v\n%s", err, out)
	}
	l.told(h, args)
}

// told tells OnRule's f of rules (each one's arguments after -w), applied in h.
func (l *Lab) told(h *Host, rules ...[]string) {
	l.mu.Lock()
	f := l.onRule
	l.mu.Unlock()
	if f == nil {
		return
	}
	for _, r := range rules {
		f(h, r)
	}
}

// Dir is where the processes' logs are.
func (l *Lab) Dir() string { return l.dir }

// Close kills what still runs in the lab and removes every namespace. It keeps going past errors (a cleanup).
func (l *Lab) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	hosts := l.hosts
	l.mu.Unlock()
	var errs []error
	for _, ns := range append(hostNamespaces(hosts), l.sw) {
		killIn(ns)
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %v: %s", ns, err, out))
		}
	}
	if err := errors.Join(errs...); err != nil {
		l.t.Errorf("netns lab: cleaning up: %v", err)
	}
}

func hostNamespaces(hosts []*Host) []string {
	var out []string
	for _, h := range hosts {
		out = append(out, h.NS)
	}
	return out
}
