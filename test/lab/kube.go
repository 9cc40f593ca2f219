package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/test/ipmisim"
	"github.com/hale-dev/hale/test/lab/power"
	"github.com/hale-dev/hale/test/netns"
)

// A Kube lab is a real kubeadm cluster on the lab's hosts: each node a privileged podman container
// running systemd (the approach of kind), joined to its host's network namespace, booted from the root
// filesystem test/kube/build-cluster makes (containerd, the kubelet, kubeadm), with a disk of its own
// (an overlay over that root filesystem, and a directory for containerd's store). kubeadm init and
// join --control-plane make the control plane: etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler as static pods run by each node's kubelet. A load balancer host (haproxy, as kind's)
// is the control-plane endpoint. Each node's power is its BMC's: Off kills every process of the node
// at once (podman kill: the node's PID namespace goes), On boots it again from its disk; a hung node is
// a frozen one (podman pause: the cgroup freezer).

// KubeShape is the cluster: control-plane nodes (each an etcd member), workers, and how many of the
// control-plane nodes (the last ones) have an IPMI BMC (ipmi_sim) instead of a Redfish one.
type KubeShape struct {
	ControlPlanes, Workers, IPMI int
}

// KubeCluster is a running kubeadm cluster.
type KubeCluster struct {
	T      netns.TB
	Lab    *netns.Lab
	Assets string // test/kube/build-cluster's directory
	Dir    string
	Nodes  []*Node // the control-plane nodes first
	// LB is the control-plane endpoint's host (haproxy), Admin the operator's (kubectl, the hub's CLI),
	// OOB the BMCs'.
	LB, Admin, OOB *netns.Host
	// Kubeconfig is kubeadm's admin.conf, for kubectl run on Admin.
	Kubeconfig string
	Redfish    *bmcsim.Server
	IPMI       map[string]*ipmisim.Sim
	// BMCCreds is the Redfish simulator's credentials file (username=, password=).
	BMCCreds string
	// Overlay is the directory of the user's own overlay (install.md), once InstallHale made it.
	Overlay string
	id      string
	onEvent func(kind, target, detail string)
	cgroup  string // the nodes' parent cgroup (weighCPU)
	mu      sync.Mutex
	events  []string    // every power change and BMC request: "power-off cp-0 Redfish"
	times   []time.Time // when each of events happened
}

// Node is one machine of the cluster.
type Node struct {
	Name         string
	Host         *netns.Host
	ControlPlane bool
	PodCIDR      string
	BMC, Creds   string // its BMC's endpoint and credentials file
	c            *KubeCluster
	dir          string
	container    string

	mu     sync.Mutex
	on     bool
	frozen bool
	dead   bool // destroyed: its BMC powers it on and nothing boots
}

const (
	kubePodSubnet     = "10.244.0.0/16"
	kubeServiceSubnet = "10.96.0.0/16"
	kubeToken         = "halelb.0123456789abcdef"
	// kubeCertificateKey encrypts the control-plane certificates kubeadm init uploads for the joins.
	kubeCertificateKey = "6e1b2c5a7d8f9e0a1b2c3d4e5f60718293a4b5c6d7e8f9011223344556677889"
	// KubeContainerPrefix names every node container (KubeContainerPrefix-PID-…), so that a later run
	// removes what a killed one left.
	KubeContainerPrefix = "halek-"
)

// KubeAssets builds (or finds) test/kube/build-cluster's directory.
func KubeAssets() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(root, "test", "kube", "build-cluster"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("test/kube/build-cluster: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// KubeAvailable says why a kubeadm cluster cannot run here, or "" when it can.
func KubeAvailable() string {
	if why := netns.Available(); why != "" {
		return why
	}
	for _, tool := range []string{"podman", "haproxy"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("%s is not on PATH (Debian: apt-get install podman runc haproxy; test/run installs them)", tool)
		}
	}
	return ""
}

// KubeOptions are a cluster's settings beyond its shape.
type KubeOptions struct {
	// OnEvent, when set, is told of every power change ("power-on", "power-off": by whom).
	OnEvent func(kind, target, detail string)
}

// StartKube makes the cluster of shape from assets (KubeAssets): hosts, BMCs, nodes powered on, kubeadm
// init on the first control-plane node, the others joined, every Node Ready. It is torn down when t
// ends.
func StartKube(t netns.TB, assets string, shape KubeShape, o KubeOptions) *KubeCluster {
	t.Helper()
	RemoveKubeLeftovers(t)
	raiseInotifyLimits(t)
	lab := netns.New(t)
	c := &KubeCluster{T: t, Lab: lab, Assets: assets, Dir: t.TempDir(), IPMI: map[string]*ipmisim.Sim{}, onEvent: o.OnEvent,
		id: fmt.Sprintf("%s%d-%d", KubeContainerPrefix, os.Getpid(), time.Now().UnixNano()%1e6)}
	for i := range shape.ControlPlanes + shape.Workers {
		n := &Node{c: c, ControlPlane: i < shape.ControlPlanes, PodCIDR: fmt.Sprintf("10.244.%d.0/24", i+1)}
		n.Name = fmt.Sprintf("cp-%d", i)
		if !n.ControlPlane {
			n.Name = fmt.Sprintf("w-%d", i-shape.ControlPlanes)
		}
		n.Host = lab.Host(n.Name)
		n.dir = filepath.Join(c.Dir, n.Name)
		n.container = c.id + "-" + n.Name
		c.Nodes = append(c.Nodes, n)
	}
	c.LB, c.Admin, c.OOB = lab.Host("lb"), lab.Host("admin"), lab.Host("oob")
	// Each node routes every other node's pods to that node (what a CNI's routing does between nodes),
	// and has a default route (the kubelet and kube-proxy look for one; it leads nowhere else).
	for _, n := range c.Nodes {
		c.must("ip", "-n", n.Host.NS, "route", "add", "default", "dev", "eth0")
		for _, o := range c.Nodes {
			if o != n {
				c.must("ip", "-n", n.Host.NS, "route", "add", o.PodCIDR, "via", o.Host.IP)
			}
		}
	}
	c.startLB()
	c.startBMCs(shape)
	c.weighCPU(len(c.Nodes))
	t.Cleanup(c.teardown)
	for _, n := range c.Nodes {
		n.prepare()
		n.PowerOn("start")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c.bootstrap(ctx)
	return c
}

// raiseInotifyLimits raises the machine's inotify limits to what a cluster's nodes need (it never
// lowers them). Every node is a systemd machine with containerd and a kubelet, their processes root on
// this machine, and the limits are per user: two clusters side by side outgrow the default 128
// instances, and a node's systemd that gets none freezes at boot without a word (its kubeadm never
// runs). kind asks its users to raise the same.
func raiseInotifyLimits(t netns.TB) {
	t.Helper()
	for path, least := range map[string]int{"/proc/sys/fs/inotify/max_user_instances": 1024, "/proc/sys/fs/inotify/max_user_watches": 524288} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("kube lab: %v", err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("kube lab: %s: %v", path, err)
		}
		if n >= least {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.Itoa(least)), 0o644); err != nil {
			t.Fatalf("kube lab: raising %s from %d to %d (the nodes' systemd, containerd and kubelets need them): %v", path, n, least, err)
		}
		t.Logf("kube lab: %s raised from %d to %d (the nodes' systemd, containerd and kubelets need them)", path, n, least)
	}
}

func (c *KubeCluster) must(args ...string) string {
	c.T.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		c.T.Fatalf("kube lab: %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// RemoveKubeLeftovers removes the node containers of runs whose process is gone, and their disks.
func RemoveKubeLeftovers(t netns.TB) {
	out, err := exec.Command("podman", "ps", "-a", "--format", "{{.Names}}").Output()
	if err != nil {
		t.Fatalf("podman ps: %v", err)
	}
	for _, name := range strings.Fields(string(out)) {
		if !leftBehind(name) {
			continue
		}
		rootfs, _ := exec.Command("podman", "inspect", "--format", "{{.Rootfs}}", name).Output()
		_ = exec.Command("podman", "rm", "-f", "-t", "0", name).Run()
		if r := strings.TrimSpace(string(rootfs)); r != "" {
			// Its disk too (gigabytes each: a killed test leaves its directory behind).
			if exec.Command("umount", "-l", r).Run() == nil && filepath.Base(r) == "root" {
				_ = os.RemoveAll(filepath.Dir(r))
			}
		}
		t.Logf("kube lab: removed node container %s, left behind by an earlier run", name)
	}
	// Their parent cgroups (weighCPU): at the top, or under the cgroup of the test that made them.
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", KubeContainerPrefix+"*"))
	nested, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "*", KubeContainerPrefix+"*"))
	for _, d := range append(dirs, nested...) {
		if leftBehind(filepath.Base(d)) {
			removeCgroup(d)
		}
	}
}

// leftBehind says whether name (a node container's, or the nodes' cgroup's: the lab's id, "halek-PID-N")
// belongs to a run whose process is gone.
func leftBehind(name string) bool {
	pid, _, ok := strings.Cut(strings.TrimPrefix(name, KubeContainerPrefix), "-")
	if !strings.HasPrefix(name, KubeContainerPrefix) || !ok {
		return false
	}
	if n, err := strconv.Atoi(pid); err == nil {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", n)); err == nil {
			return false
		}
	}
	return true
}

// startLB runs haproxy on the LB host: the control-plane endpoint, forwarding to every API server that
// answers its /healthz (checked every second). A server marked down has its sessions closed: a
// client's connection to a frozen API server would otherwise stay open, silent, until the client's
// own timeout.
func (c *KubeCluster) startLB() {
	var cfg strings.Builder
	fmt.Fprintf(&cfg, `global
  log stderr format raw local0 notice
defaults
  mode tcp
  log global
  timeout connect 3s
  timeout client 1h
  timeout server 1h
frontend control-plane
  bind %s
  default_backend apiservers
backend apiservers
  option httpchk GET /healthz
  default-server check check-ssl verify none inter 1s fall 2 rise 1 on-marked-down shutdown-sessions
`, c.LB.Addr(6443))
	for _, n := range c.Nodes {
		if n.ControlPlane {
			fmt.Fprintf(&cfg, "  server %s %s\n", n.Name, n.Host.Addr(6443))
		}
	}
	path := filepath.Join(c.Dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		c.T.Fatalf("kube lab: %v", err)
	}
	c.LB.Start("haproxy", "haproxy", "-db", "-f", path)
}

// startBMCs starts the Redfish simulator on the out-of-band host for the nodes without an IPMI BMC,
// and an ipmi_sim for each of the last shape.IPMI control-plane nodes; their power is the nodes'.
func (c *KubeCluster) startBMCs(shape KubeShape) {
	c.BMCCreds = filepath.Join(c.Dir, "bmc-credentials")
	if err := os.WriteFile(c.BMCCreds, []byte("username=admin\npassword=lab-secret\n"), 0o600); err != nil {
		c.T.Fatalf("kube lab: %v", err)
	}
	ipmiFrom := shape.ControlPlanes - shape.IPMI
	var ids []string
	for i, n := range c.Nodes {
		if !n.ControlPlane || i < ipmiFrom {
			ids = append(ids, n.Name)
			n.BMC, n.Creds = fmt.Sprintf("redfish+http://%s/systems/%s", c.OOB.Addr(8000), n.Name), c.BMCCreds
		}
	}
	c.Redfish = startRedfish(c.T, c.OOB, ids, 200*time.Millisecond, func(id string) power.Machine { return c.Node(id) }, c.event)
	for i, n := range c.Nodes[ipmiFrom:shape.ControlPlanes] {
		dir := filepath.Join(c.Dir, "ipmi-"+n.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			c.T.Fatalf("kube lab: %v", err)
		}
		// One login for every BMC (as one Secret in deploy/components/bmc gives them all).
		sim, err := ipmisim.StartAt(dir, ipmisim.Options{Host: c.OOB.IP, Port: 6230 + i, Wrap: []string{"ip", "netns", "exec", c.OOB.NS},
			Password: "lab-secret"})
		if err != nil {
			c.T.Fatalf("kube lab: ipmi_sim for %s: %v", n.Name, err)
		}
		c.IPMI[n.Name] = sim
		n.BMC, n.Creds = sim.Endpoint(), c.BMCCreds
		followIPMI(c.T, n, sim)
	}
}

func (c *KubeCluster) event(kind, target, detail string) {
	c.mu.Lock()
	c.events = append(c.events, kind+" "+target+" "+detail)
	c.times = append(c.times, time.Now())
	c.mu.Unlock()
	if c.onEvent != nil {
		c.onEvent(kind, target, detail)
	}
}

// PowerEvents are the power changes and BMC requests so far, "KIND NODE BY" each ("power-on cp-0
// start", "power-off cp-1 Redfish", "bmc-request cp-1 POST").
func (c *KubeCluster) PowerEvents() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// PowerEventAt is when the i'th of PowerEvents happened.
func (c *KubeCluster) PowerEventAt(i int) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.times[i]
}

// Node is the node named name.
func (c *KubeCluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	c.T.Fatalf("kube lab: no node %s", name)
	return nil
}

// ControlPlanes are the control-plane nodes.
func (c *KubeCluster) ControlPlanes() []*Node {
	var cps []*Node
	for _, n := range c.Nodes {
		if n.ControlPlane {
			cps = append(cps, n)
		}
	}
	return cps
}

// teardown removes the node containers and unmounts their disks (before the test's directory goes),
// then the nodes' parent cgroup.
func (c *KubeCluster) teardown() {
	for _, n := range c.Nodes {
		_ = exec.Command("podman", "rm", "-f", "-t", "0", n.container).Run()
		_ = exec.Command("umount", "-l", n.root()).Run()
	}
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", c.cgroup))
	for _, d := range dirs {
		removeCgroup(d)
	}
}

// removeCgroup removes a cgroup v1 directory and those under it (podman's conmon group stays behind).
func removeCgroup(dir string) {
	subs, _ := filepath.Glob(filepath.Join(dir, "*", "cgroup.procs"))
	for _, s := range subs {
		removeCgroup(filepath.Dir(s))
	}
	_ = os.Remove(dir)
}

// weighCPU makes the cgroup the nodes run under (cgroup v1, podman's cgroupfs manager) weigh as much
// as n busy processes beside the test's own: the machines of a real cluster have CPUs of their own.
// podman's own parent group, holding every node, weighs 1024 in all, as one thread of the processes
// beside it: under load the five nodes together had the CPU of one process. Booting a node (its static
// pods, its API server filling its caches) then starved the others for seconds: in a cold full run
// (beside test/quorumlost) memberlist and etcd on a node that was not hung stopped answering the
// observers, and the hub judged it dead (by 4 of 6 observers) and began a remediation of it.
// The group is made under this process's own CPU cgroup: what the nodes take is taken from whoever
// runs the test.
func (c *KubeCluster) weighCPU(n int) {
	c.cgroup = path.Join(ownCgroup("cpu"), c.id)
	dir := filepath.Join("/sys/fs/cgroup/cpu", c.cgroup)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.T.Fatalf("kube lab: the nodes' cgroup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.shares"), []byte(strconv.Itoa(1024*n)), 0o644); err != nil {
		c.T.Fatalf("kube lab: the nodes' CPU weight: %v", err)
	}
}

// ownCgroup is this process's cgroup (v1) in the hierarchy of controller, "/" when it has none.
func ownCgroup(controller string) string {
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), controller) {
			return f[2]
		}
	}
	return "/"
}

// Container is the node's podman container.
func (n *Node) Container() string { return n.container }

// root is where the node's root filesystem is mounted on this machine.
func (n *Node) root() string { return filepath.Join(n.dir, "root") }

// prepare makes the node's disk: an overlay over the built root filesystem (the node's writes go to
// its upper directory) and the directory containerd's store lives in (containerd's overlay snapshots
// cannot have an overlay beneath them), then writes the node's own files: its CNI configuration
// (a bridge for its pods' subnet) and its hostname.
func (n *Node) prepare() {
	c := n.c
	for _, d := range []string{"upper", "work", "root", "containerd"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			c.T.Fatalf("kube lab: %v", err)
		}
	}
	n.mount()
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "lab",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, n.PodCIDR)
	n.WriteFile("/etc/cni/net.d/10-lab.conflist", cni)
	n.WriteFile("/etc/hostname", n.Name+"\n")
}

// mount mounts the node's disk unless it is mounted.
func (n *Node) mount() {
	if exec.Command("mountpoint", "-q", n.root()).Run() == nil {
		return
	}
	n.c.must("mount", "-t", "overlay", "overlay", "-o",
		fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", filepath.Join(n.c.Assets, "rootfs"), filepath.Join(n.dir, "upper"), filepath.Join(n.dir, "work")),
		n.root())
}

// WriteFile writes a file on the node's disk (path as the node sees it).
func (n *Node) WriteFile(path, body string) {
	p := filepath.Join(n.root(), path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		n.c.T.Fatalf("kube lab: %v", err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		n.c.T.Fatalf("kube lab: %v", err)
	}
}

// DiskPath is where path (as the node sees it) is on this machine: for what an operator does to a
// disk while its machine is off.
func (n *Node) DiskPath(path string) string { return filepath.Join(n.root(), path) }

// ReadFile reads a file from the node's disk (path as the node sees it).
func (n *Node) ReadFile(path string) ([]byte, error) {
	return os.ReadFile(filepath.Join(n.root(), path))
}

// PowerOn boots the node from its disk (systemd, then containerd, the kubelet and its static pods).
func (n *Node) PowerOn(by string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.on {
		return
	}
	c := n.c
	if n.dead {
		n.on = true // the BMC reads it on; nothing boots
		c.event("power-on", n.Name, by)
		return
	}
	if exec.Command("podman", "container", "exists", n.container).Run() == nil {
		c.must("podman", "start", n.container)
	} else {
		// runc, not crun (crun refuses this machine's hybrid cgroup v1); limits within this machine's
		// own (podman would raise them, which is refused here); a cgroup namespace of its own, so that
		// the kubelet's cgroups nest under the node's and its freezer freezes them.
		c.must("podman", "run", "-d", "--name", n.container, "--hostname", n.Name, "--runtime", "runc", "--cgroup-parent", c.cgroup,
			"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--privileged", "--cgroupns", "private",
			"--network", "ns:/run/netns/"+n.Host.NS, "--systemd", "always", "--tmpfs", "/run", "--tmpfs", "/tmp",
			"-v", filepath.Join(n.dir, "containerd")+":/var/lib/containerd",
			"--rootfs", n.root(), "/sbin/init")
	}
	n.on, n.frozen = true, false
	c.event("power-on", n.Name, by)
}

// PowerOff stops every process of the node at once, as a power cut does; its disk stays.
func (n *Node) PowerOff(by string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.on {
		return
	}
	c := n.c
	// A frozen node is killed frozen: the SIGKILL is pending when the freezer lets go, so none of its
	// processes runs again, as on a hung machine whose power is cut. (It was thawed first until
	// 2026-11-29, which let its agent send one more report after the hang.)
	if !n.dead {
		c.must("podman", "kill", "--signal", "KILL", n.container)
		_ = exec.Command("podman", "wait", n.container).Run()
	}
	n.on, n.frozen = false, false
	c.event("power-off", n.Name, by)
}

// provisioning is what a machine's provisioning puts on a new disk of a control-plane node: kubeadm's
// configuration and certificates, and the kubelet's (the same machine: name, addresses, BMC).
func provisioning() []string {
	return []string{"etc/kubernetes", "var/lib/kubelet/config.yaml", "var/lib/kubelet/kubeadm-flags.env", "var/lib/kubelet/pki"}
}

// Destroy loses the machine for good: its power cut, its disk gone (everything the node wrote: etcd's
// data, kubeadm's files, the kubelet's), and its board dead (its BMC still powers it on and reads it
// on, and nothing boots). What a provisioning system would put back on a replacement (provisioning)
// is kept aside for Replace, as is containerd's image store (a replacement has the images; there is
// no registry to pull them from).
func (n *Node) Destroy() {
	n.PowerOff("destroyed")
	keep := filepath.Join(n.dir, "provisioning")
	for _, p := range provisioning() {
		n.c.must("mkdir", "-p", filepath.Dir(filepath.Join(keep, p)))
		n.c.must("cp", "-a", filepath.Join(n.root(), p), filepath.Join(keep, p))
	}
	n.c.must("umount", n.root())
	n.c.must("rm", "-rf", filepath.Join(n.dir, "upper"), filepath.Join(n.dir, "work"))
	n.mu.Lock()
	n.dead = true
	n.mu.Unlock()
}

// Replace puts a new machine in a destroyed one's place, still off: a new board, the same name,
// addresses and BMC, a new disk with its provisioning (Destroy) and nothing else (no etcd data).
func (n *Node) Replace() {
	n.mu.Lock()
	n.dead = false
	n.mu.Unlock()
	n.prepare()
	keep := filepath.Join(n.dir, "provisioning")
	for _, p := range provisioning() {
		n.c.must("mkdir", "-p", filepath.Dir(filepath.Join(n.root(), p)))
		n.c.must("cp", "-a", filepath.Join(keep, p), filepath.Join(n.root(), p))
	}
	n.c.must("rm", "-rf", keep)
}

// Freeze hangs the node: every process of it stops where it is (the cgroup freezer), its network
// stays up and answers nothing. The cgroup v1 freezer gives up when a process does not stop in time
// (runc: "unable to freeze", seen under the full test run's load): the node is thawed and frozen again,
// up to five times.
func (n *Node) Freeze() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.on || n.frozen {
		return
	}
	var out []byte
	var err error
	for range 5 {
		if out, err = exec.Command("podman", "pause", n.container).CombinedOutput(); err == nil {
			n.frozen = true
			return
		}
		_ = exec.Command("podman", "unpause", n.container).Run()
		time.Sleep(time.Second)
	}
	n.c.T.Fatalf("kube lab: podman pause %s: %v\n%s", n.container, err, out)
}

// Thaw lets a frozen node go on where it stopped, as a machine that hung and came back by itself.
func (n *Node) Thaw() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.frozen {
		return
	}
	if out, err := exec.Command("podman", "unpause", n.container).CombinedOutput(); err != nil {
		n.c.T.Fatalf("kube lab: podman unpause %s: %v\n%s", n.container, err, out)
	}
	n.frozen = false
}

// Exec runs a command on the node and returns its combined output.
func (n *Node) Exec(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "podman", append([]string{"exec", n.container}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s on %s: %w: %s", strings.Join(args, " "), n.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// keepForDebugging, with HALE_KUBE_KEEP set (to a duration, e.g. 30m), leaves a cluster that failed
// to start running that long before it is torn down, for a look inside (podman exec NODE …).
func (c *KubeCluster) keepForDebugging() {
	if d, err := time.ParseDuration(os.Getenv("HALE_KUBE_KEEP")); err == nil {
		c.T.Logf("kube lab: HALE_KUBE_KEEP: keeping the cluster for %s (containers %s-*)", d, c.id)
		time.Sleep(d)
	}
}

// Diagnose is what a failure on the node is read from: its containers and the kubelet's last words.
func (n *Node) Diagnose(ctx context.Context) string {
	ps, _ := n.Exec(ctx, "crictl", "ps", "-a")
	// (the kubelet repeats "Unable to register mirror pod" ten times a second while its API server is down)
	journal, _ := n.Exec(ctx, "sh", "-c", "journalctl --no-pager -n 2000 -u kubelet -u containerd | grep -v 'register mirror pod' | tail -n 60")
	etcd, _ := n.Exec(ctx, "sh", "-c", "crictl logs --tail 20 $(crictl ps -a -q --name etcd | head -1)")
	return fmt.Sprintf("%s's containers:\n%s\n%s's kubelet and containerd:\n%s\n%s's latest etcd container:\n%s", n.Name, ps, n.Name, journal, n.Name, etcd)
}

// Diagnostics is what a failed scenario needs to be understood: each control-plane node's
// containers and its latest etcd and agent containers' logs, and each worker's hub containers' last log lines
// (the hub's replicas run there; their logs are read through the node, as the API server may be down).
// A frozen node says so and is skipped.
func (c *KubeCluster) Diagnostics(ctx context.Context) string {
	var b strings.Builder
	for _, n := range c.Nodes {
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		if state, _ := exec.CommandContext(ctx, "podman", "inspect", "--format", "{{.State.Status}}", n.container).Output(); strings.TrimSpace(string(state)) != "running" {
			fmt.Fprintf(&b, "== %s: %s\n", n.Name, strings.TrimSpace(string(state)))
			cancel()
			continue
		}
		if n.ControlPlane {
			ps, _ := n.Exec(ctx, "crictl", "ps", "-a")
			etcd, _ := n.Exec(ctx, "sh", "-c", "crictl logs --tail 15 $(crictl ps -a -q --name etcd | head -1) 2>&1")
			agent, _ := n.Exec(ctx, "sh", "-c", "crictl logs --tail 20 $(crictl ps -a -q --name agent | head -1) 2>&1 | cut -c1-400")
			// The kubelet's errors and warnings (klog's E and W lines): why a pod is not (re)started,
			// why the Node's status is not posted.
			kubelet, _ := n.Exec(ctx, "sh", "-c", "journalctl --no-pager -n 3000 -u kubelet | grep -E ' [EW][0-9]{4} ' | tail -n 25 | cut -c1-400")
			fmt.Fprintf(&b, "== %s's containers:\n%s\n== %s's latest etcd container:\n%s\n== %s's latest agent container:\n%s\n== %s's kubelet, errors and warnings:\n%s\n",
				n.Name, ps, n.Name, etcd, n.Name, agent, n.Name, kubelet)
		} else {
			fmt.Fprintf(&b, "== %s's hub containers:\n%s\n", n.Name, n.hubLogs(ctx, "tail -n 60 | cut -c1-400", ""))
		}
		cancel()
	}
	return b.String()
}

// HubLines are the lines of every hub container's log (on the workers, read through the node) that
// match the extended regular expression pattern, prefixed like Diagnostics' (e.g. the notices that
// explain a power action: what made a machine Unhealthy, which remediation began).
func (c *KubeCluster) HubLines(ctx context.Context, pattern string) string {
	var b strings.Builder
	for _, n := range c.Nodes {
		if n.ControlPlane {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		out := n.hubLogs(ctx, `grep -E "$1" | tail -n 40 | cut -c1-600`, pattern)
		cancel()
		fmt.Fprintf(&b, "== %s's hub containers, lines matching %q:\n%s\n", n.Name, pattern, out)
	}
	return b.String()
}

// hubLogs is the log of each hub container on worker n, through the shell pipeline pipe (arg is its
// $1), each line prefixed "hub> " (test/run's summary keeps only the errors of lines that begin as
// JSON logs).
func (n *Node) hubLogs(ctx context.Context, pipe, arg string) string {
	out, _ := n.Exec(ctx, "sh", "-c", "for c in $(crictl ps -a -q --label io.kubernetes.container.name=hub); do echo \"-- container $c\"; "+
		"crictl logs $c 2>&1 | "+pipe+" | sed 's/^/hub> /'; done", "sh", arg)
	return out
}

// bootstrap makes the cluster: kubeadm init on the first control-plane node, the other control-plane
// nodes joined one at a time (each adds an etcd member), then the workers, and waits for every Node
// to be Ready.
func (c *KubeCluster) bootstrap(ctx context.Context) {
	c.T.Helper()
	first := c.Nodes[0]
	for _, n := range c.Nodes {
		n.WriteFile("/etc/kubernetes/lab/kubeadm.yaml", c.kubeadmConfig(n))
		c.waitRunning(ctx, n)
	}
	start := time.Now()
	if _, err := first.Exec(ctx, "kubeadm", "init", "--config", "/etc/kubernetes/lab/kubeadm.yaml", "--upload-certs"); err != nil {
		c.keepForDebugging()
		c.T.Fatalf("kube lab: kubeadm init: %v\n%s", err, first.Diagnose(ctx))
	}
	c.T.Logf("kube lab: kubeadm init on %s: %s", first.Name, time.Since(start).Round(time.Second))
	admin, err := first.ReadFile("/etc/kubernetes/admin.conf")
	if err != nil {
		c.T.Fatalf("kube lab: %v", err)
	}
	c.Kubeconfig = filepath.Join(c.Dir, "admin.conf")
	if err := os.WriteFile(c.Kubeconfig, admin, 0o600); err != nil {
		c.T.Fatalf("kube lab: %v", err)
	}
	join := func(n *Node) error {
		start := time.Now()
		if _, err := n.Exec(ctx, "kubeadm", "join", "--config", "/etc/kubernetes/lab/kubeadm.yaml"); err != nil {
			return fmt.Errorf("kubeadm join on %s: %w\n%s", n.Name, err, n.Diagnose(ctx))
		}
		c.T.Logf("kube lab: kubeadm join on %s: %s", n.Name, time.Since(start).Round(time.Second))
		return nil
	}
	// The workers join beside the control-plane nodes, which join one at a time (each adds a member).
	workers := make(chan error, len(c.Nodes))
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		if !n.ControlPlane {
			wg.Go(func() { workers <- join(n) })
		}
	}
	var errs []error
	for _, n := range c.Nodes[1:] {
		if n.ControlPlane {
			if err := join(n); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	wg.Wait()
	close(workers)
	for err := range workers {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		c.keepForDebugging()
		c.T.Fatalf("kube lab: %v", err)
	}
	c.WaitReady(ctx)
}

// waitRunning waits until the node has booted (systemd's start-up done) with the control-plane image
// imported.
func (c *KubeCluster) waitRunning(ctx context.Context, n *Node) {
	c.T.Helper()
	for {
		// Fails while systemd is not up to answer yet; then blocks until its start-up is done.
		state, err := n.Exec(ctx, "systemctl", "is-system-running", "--wait")
		state = strings.TrimSpace(state)
		if err == nil || state == "degraded" {
			break
		}
		select {
		case <-ctx.Done():
			c.T.Fatalf("kube lab: %s did not boot: %s", n.Name, state)
		case <-time.After(time.Second):
		}
	}
	if out, err := n.Exec(ctx, "systemctl", "is-active", "node-images.service", "containerd.service"); err != nil {
		journal, _ := n.Exec(ctx, "journalctl", "--no-pager", "-n", "40", "-u", "node-images", "-u", "containerd")
		c.T.Fatalf("kube lab: %s booted without containerd or its images: %s\n%s", n.Name, out, journal)
	}
}

// WaitReady waits until every Node is Ready.
func (c *KubeCluster) WaitReady(ctx context.Context) {
	c.T.Helper()
	start := time.Now()
	var last string
	for {
		out, err := c.Kubectl(ctx, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
		ready := 0
		for _, f := range strings.Fields(out) {
			if strings.HasSuffix(f, "=True") {
				ready++
			}
		}
		if err == nil && ready == len(c.Nodes) {
			c.T.Logf("kube lab: every node Ready after %s", time.Since(start).Round(time.Second))
			return
		}
		last = out
		select {
		case <-ctx.Done():
			c.T.Fatalf("kube lab: nodes not Ready: %s", last)
		case <-time.After(2 * time.Second):
		}
	}
}

// kubectlTimeout bounds a Kubectl call that sets no timeout of its own. Without one, a call whose
// connection went (through the load balancer) to an API server that then froze waits forever: the
// load balancer marks the server down for new connections only.
const kubectlTimeout = 20 * time.Second

// Kubectl runs kubectl (the node image's) on the Admin host with kubeadm's admin.conf. A call whose
// arguments (before any "--") set no --timeout or --request-timeout ends after kubectlTimeout.
func (c *KubeCluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	own := args
	if i := slices.Index(args, "--"); i >= 0 {
		own = args[:i]
	}
	if !slices.ContainsFunc(own, func(a string) bool {
		return strings.HasPrefix(a, "--timeout") || strings.HasPrefix(a, "--request-timeout")
	}) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, kubectlTimeout)
		defer cancel()
		args = append([]string{fmt.Sprintf("--request-timeout=%s", kubectlTimeout-2*time.Second)}, args...)
	}
	kubectl := filepath.Join(c.adminPath(), "kubectl")
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", c.Admin.NS, kubectl, "--kubeconfig", c.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Shell types a command line into AdminShell, started in dir, as an operator does.
func (c *KubeCluster) Shell(ctx context.Context, dir, line string) (string, error) {
	return c.ShellOn(ctx, c.Admin, c.Kubeconfig, dir, line)
}

// ShellOn types a command line into an operator's shell on host, as AdminShell's but with KUBECONFIG
// set to kubeconfig (another cluster's, such as a management cluster's), started in dir.
func (c *KubeCluster) ShellOn(ctx context.Context, host *netns.Host, kubeconfig, dir, line string) (string, error) {
	cmd := exec.CommandContext(ctx, "sh", "-c", c.shellOn(host, kubeconfig))
	cmd.Dir, cmd.Stdin = dir, strings.NewReader(line+"\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", line, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// AdminShell is the command line (as root, on this machine) that opens an operator's shell on the
// Admin host: kubectl (the node image's) on PATH, KUBECONFIG set to kubeadm's admin.conf.
func (c *KubeCluster) AdminShell() string { return c.shellOn(c.Admin, c.Kubeconfig) }

// shellOn is the command line that opens an operator's shell on host, KUBECONFIG set to kubeconfig.
func (c *KubeCluster) shellOn(host *netns.Host, kubeconfig string) string {
	return fmt.Sprintf("ip netns exec %s env KUBECONFIG=%s PATH=%s:$PATH bash", host.NS, kubeconfig, c.adminPath())
}

func (c *KubeCluster) adminPath() string {
	return filepath.Join(c.Assets, "rootfs", "usr", "local", "bin")
}

// LoadImage imports an OCI archive into every node's containerd (its Kubernetes namespace) as
// name:TAG, TAG the archive's own: what a registry pull would have put there. The nodes import it
// side by side.
func (c *KubeCluster) LoadImage(ctx context.Context, archive, name string) {
	c.T.Helper()
	data, err := os.ReadFile(archive)
	if err != nil {
		c.T.Fatalf("kube lab: %v", err)
	}
	body := string(data) // converted once, not once per node
	dst := filepath.Join("/var/tmp", filepath.Base(archive))
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		n.WriteFile(dst, body)
		wg.Go(func() {
			if out, err := n.Exec(ctx, "ctr", "--namespace", "k8s.io", "images", "import", "--base-name", name, dst); err != nil {
				errs[i] = fmt.Errorf("loading %s on %s: %w\n%s", archive, n.Name, err, out)
			}
			_, _ = n.Exec(ctx, "rm", "-f", dst)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.T.Fatalf("kube lab: %v", err)
	}
}

// kubeadmConfig is node n's kubeadm configuration: InitConfiguration, ClusterConfiguration,
// KubeletConfiguration and KubeProxyConfiguration for the first node, a JoinConfiguration for the
// others. What differs from kubeadm's defaults, and why:
//   - the control-plane endpoint is the load balancer, so that any two API servers serve the cluster;
//   - the bootstrap token and the certificate key are fixed (a lab's), so every join is known ahead;
//   - etcd's image tag is the etcd this lab builds (v3.6.16), not kubeadm's default 3.6.8;
//   - the coredns addon is skipped: nothing here resolves names in the cluster;
//   - preflight: SystemVerification reads the kernel's config, which a container cannot see; Swap,
//     this machine's; FileContent--proc-sys-net-bridge-bridge-nf-call-iptables, a setting of the
//     machine, not of the node's namespace;
//   - the kubelet: failCgroupV1 false, because this machine runs cgroup v1 (hybrid) and the kubelet
//     of v1.35 and later refuses to start on it otherwise (cgroup v1 is deprecated, not removed);
//     cgroupfs as its cgroup driver (no systemd cgroup delegation under cgroup v1 in a container);
//   - the kubelet's disk thresholds at 1%, and no image garbage collection: every node's disk is this
//     machine's, whose free share is not the node's business (at 14.7% free, under the default 15%,
//     the workers were tainted with disk pressure and the hub never scheduled), and an image collected
//     cannot be pulled again (no registry);
//   - kube-proxy: conntrack's table size left as it is (a container may not set the machine's).
func (c *KubeCluster) kubeadmConfig(n *Node) string {
	var lb string
	if c.LB != nil {
		lb = c.LB.Addr(6443)
	}
	node := fmt.Sprintf(`nodeRegistration:
  name: %s
  criSocket: unix:///run/containerd/containerd.sock
  kubeletExtraArgs:
    - {name: node-ip, value: %s}
  ignorePreflightErrors: [SystemVerification, Swap, FileContent--proc-sys-net-bridge-bridge-nf-call-iptables]
`, n.Name, n.Host.IP)
	if n != c.Nodes[0] {
		cp := ""
		if n.ControlPlane {
			cp = fmt.Sprintf("controlPlane:\n  localAPIEndpoint: {advertiseAddress: %s, bindPort: 6443}\n  certificateKey: %s\n", n.Host.IP, kubeCertificateKey)
		}
		return fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken: {apiServerEndpoint: "%s", token: %s, unsafeSkipCAVerification: true}
%s%s`, lb, kubeToken, cp, node)
	}
	return fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint: {advertiseAddress: %s, bindPort: 6443}
bootstrapTokens:
  - {token: %s, ttl: 24h0m0s}
certificateKey: %s
skipPhases: [addon/coredns]
%s---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.36.3
controlPlaneEndpoint: "%s"
networking: {podSubnet: %s, serviceSubnet: %s}
etcd: {local: {imageTag: 3.6.16-0}}
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
evictionHard: {memory.available: 100Mi, nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%", imagefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
conntrack: {maxPerCore: 0}
`, n.Host.IP, kubeToken, kubeCertificateKey, node, lb, kubePodSubnet, kubeServiceSubnet)
}
