package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/test/ipmisim"
	"github.com/hale-dev/hale/test/netns"
	"github.com/hale-dev/hale/test/proc"
)

// The ways a machine stalls and comes back by itself, as machines really do (a VM stunned for a
// snapshot or a live migration, a storage hang, a soft lockup, a noisy neighbour, a lossy link, a
// member catching up): the stall matrix (stall_test.go) checks that none of them costs a reboot.

// Freeze stops the machine whole, as a VM stun or a hung kernel does: its etcd member and agent stopped
// (SIGSTOP) and every packet in and out of its host dropped, until Thaw. Its power going off ends the
// freeze (a reboot clears it); going on again boots it.
func (m *Machine) Freeze() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on || m.frozen {
		return
	}
	m.frozen = true
	m.c.Lab.Isolate(m.Host)
	m.signalLocked(syscall.SIGSTOP)
}

// Thaw ends a freeze: the machine goes on where it stopped, by itself.
func (m *Machine) Thaw() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.thawLocked()
}

func (m *Machine) thawLocked() {
	if !m.frozen {
		return
	}
	m.frozen = false
	m.c.Lab.Unisolate(m.Host)
	m.signalLocked(syscall.SIGCONT)
}

// signalLocked sends sig to the machine's etcd member and agent (m.mu held).
func (m *Machine) signalLocked(sig syscall.Signal) {
	etcd := m.etcd
	if m.kubelet != nil {
		etcd = m.kubelet.Process()
	}
	for _, p := range []*proc.Process{etcd, m.agent} {
		if p != nil {
			p.Signal(sig)
		}
	}
}

// logPanic has the BMC of the machine name (redfish's system name, or ipmi) log an OS critical stop in
// its event log, as Linux's IPMI driver has it logged as the kernel panics; it returns when.
func logPanic(t netns.TB, redfish *bmcsim.Server, ipmi *ipmisim.Sim, name string) time.Time {
	if ipmi != nil {
		at := time.Now()
		if err := ipmi.AddSEL(context.Background(), ipmisim.SELOSCriticalStop); err != nil {
			t.Fatalf("lab: %s's BMC did not log the panic: %v", name, err)
		}
		return at
	}
	return redfish.LogEvent(name, bmcsim.Event{SensorType: "OS Stop/Shutdown", Message: "Run-time critical stop"})
}

// Panic has the machine's BMC log an OS critical stop (logPanic), then freezes it whole: a kernel
// panic. It returns when the BMC logged it.
func (m *Machine) Panic() time.Time {
	at := logPanic(m.c.T, m.c.Redfish, m.c.IPMI[m.Name], m.Name)
	m.Freeze()
	return at
}

// Panic has the node's BMC log an OS critical stop (logPanic), then freezes it (Freeze): a kernel
// panic. It returns when the BMC logged it.
func (n *Node) Panic() time.Time {
	at := logPanic(n.c.T, n.c.Redfish, n.c.IPMI[n.Name], n.Name)
	n.Freeze()
	return at
}

// Lossy drops share of the packets in and out of the machine's host, each at random (iptables'
// statistic match), until the returned undo.
func (m *Machine) Lossy(share float64) (undo func()) {
	var others []*netns.Host
	for _, h := range m.c.Lab.Hosts() {
		if h != m.Host {
			others = append(others, h)
		}
	}
	me := []*netns.Host{m.Host}
	m.c.Lab.Drop(me, others, share)
	m.c.Lab.Drop(others, me, share)
	return func() {
		m.c.Lab.Undrop(me, others, share)
		m.c.Lab.Undrop(others, me, share)
	}
}

// Starve caps the machine's etcd member and agent at share of one core together (a group of the CPU
// controller, cgroup v1's CFS quota), as a noisy neighbour or a throttled VM does, until the returned
// undo moves them back and says how many of the quota's periods throttled them.
func (m *Machine) Starve(share float64) (undo func() (throttled int)) {
	c := m.c
	parent := filepath.Join("/sys/fs/cgroup/cpu", ownCgroup("cpu"))
	dir := filepath.Join(parent, fmt.Sprintf("halet-%d-%s-starved", os.Getpid(), m.Name))
	write := func(file, value string) {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644); err != nil {
			c.T.Fatalf("lab: starving %s: %v", m.Name, err)
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		c.T.Fatalf("lab: starving %s: %v", m.Name, err)
	}
	write("cpu.cfs_period_us", "100000")
	write("cpu.cfs_quota_us", strconv.Itoa(int(share*100000)))
	etcd, agent, _ := m.Procs()
	var pids []int
	for _, p := range []*proc.Process{etcd, agent} {
		if p != nil {
			pids = append(pids, p.Pid())
			write("cgroup.procs", strconv.Itoa(p.Pid()))
		}
	}
	return func() int {
		stat, _ := os.ReadFile(filepath.Join(dir, "cpu.stat"))
		var throttled int
		for _, line := range strings.Split(string(stat), "\n") {
			if n, ok := strings.CutPrefix(line, "nr_throttled "); ok {
				throttled, _ = strconv.Atoi(n)
			}
		}
		for _, pid := range pids {
			_ = os.WriteFile(filepath.Join(parent, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644) // gone already: rebooted
		}
		if err := os.Remove(dir); err != nil {
			c.T.Errorf("lab: removing %s's CPU cgroup: %v", m.Name, err)
		}
		return throttled
	}
}
