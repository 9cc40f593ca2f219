// Package staticpod stands in for the kubelet's static pods in tests: while an etcd manifest (as
// kubeadm writes it) is in its directory, the command it names runs, the real etcd binary in place of
// the image's; when the manifest goes, the process is stopped with SIGTERM, as the kubelet stops a pod;
// when it exits, it is started again. A machine's power is modelled too: off kills it at once and
// nothing runs until on. The real etcd recovery (agent recover) moves these manifests as it would on a
// kubeadm node.
package staticpod

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/hale-dev/hale/test/proc"
)

// Etcd is an etcd member as its manifest gives it.
type Etcd struct {
	Name, DataDir string
	// Client and Peer are the member's URLs (http://127.0.0.1:PORT).
	Client, Peer string
	// Initial is --initial-cluster, State --initial-cluster-state (new or existing).
	Initial, State string
	Token          string
}

// WriteManifest writes e's static pod manifest at path, as kubeadm lays it out.
func WriteManifest(path string, e Etcd) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: etcd
  namespace: kube-system
spec:
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:3.6.5-0
    command:
    - etcd
    - --name=%s
    - --data-dir=%s
    - --listen-client-urls=%[3]s
    - --advertise-client-urls=%[3]s
    - --listen-peer-urls=%[4]s
    - --initial-advertise-peer-urls=%[4]s
    - --initial-cluster=%s
    - --initial-cluster-state=%s
    - --initial-cluster-token=%s
    - --snapshot-count=10000
    volumeMounts:
    - {name: etcd-data, mountPath: /var/lib/etcd}
  volumes:
  - {name: etcd-data, hostPath: {path: /var/lib/etcd, type: DirectoryOrCreate}}
`, e.Name, e.DataDir, e.Client, e.Peer, e.Initial, e.State, e.Token)
	return os.WriteFile(path, []byte(manifest), 0o600)
}

// Kubelet runs one manifest's etcd.
type Kubelet struct {
	t             proc.TB
	bin, manifest string
	name          string
	start         Starter

	mu   sync.Mutex
	p    *proc.Process
	runs int
	off  bool // the machine is powered off: nothing runs
}

// Starter starts a pod's process, named name, running argv (a network namespace's host, say).
type Starter func(name string, argv ...string) *proc.Process

// Run starts watching manifest (every 50 ms) with the machine powered on, running bin for the
// manifest's etcd command (any other pod: its first container's command as written); it stops when
// the test ends.
func Run(t proc.TB, bin, name, manifest string) *Kubelet {
	k := New(t, bin, name, manifest, func(name string, argv ...string) *proc.Process {
		return proc.Start(t, name, exec.Command(argv[0], argv[1:]...))
	})
	k.PowerOn()
	return k
}

// New is Run with the machine powered off (nothing runs until PowerOn), its processes started by
// start.
func New(t proc.TB, bin, name, manifest string, start Starter) *Kubelet {
	k := &Kubelet{t: t, bin: bin, name: name, manifest: manifest, start: start, off: true}
	done := make(chan struct{})
	stopped := make(chan struct{})
	t.Cleanup(func() { close(done); <-stopped })
	go func() {
		defer close(stopped)
		for {
			k.sync()
			select {
			case <-done:
				k.mu.Lock()
				if k.p != nil {
					k.p.Stop(10 * time.Second)
				}
				k.mu.Unlock()
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return k
}

func (k *Kubelet) sync() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.p != nil && !k.p.Running() {
		k.p = nil // it exited; the kubelet starts it again
	}
	_, err := os.Stat(k.manifest)
	switch {
	case (err != nil || k.off) && k.p != nil:
		k.p.Stop(30 * time.Second)
		k.p = nil
	case err == nil && !k.off && k.p == nil:
		bin, args, err := command(k.manifest)
		if err != nil {
			k.t.Logf("%s: %v", k.name, err)
			return
		}
		if bin == "etcd" {
			bin = k.bin
		}
		k.runs++
		k.p = k.start(fmt.Sprintf("%s-run-%d", k.name, k.runs), append([]string{bin}, args...)...)
	}
}

// command is the pod's command line: the etcd container's, or else the first container's, as its
// program and its arguments.
func command(manifest string) (string, []string, error) {
	b, err := os.ReadFile(manifest)
	if err != nil {
		return "", nil, err
	}
	var pod struct {
		Spec struct {
			Containers []struct {
				Name    string   `json:"name"`
				Command []string `json:"command"`
			} `json:"containers"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &pod); err != nil {
		return "", nil, fmt.Errorf("manifest %s: %w", manifest, err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == "etcd" && len(c.Command) > 0 {
			return c.Command[0], c.Command[1:], nil
		}
	}
	if cs := pod.Spec.Containers; len(cs) > 0 && len(cs[0].Command) > 0 {
		return cs[0].Command[0], cs[0].Command[1:], nil
	}
	return "", nil, fmt.Errorf("manifest %s: no container with a command", manifest)
}

// Runs is how many times the manifest's process was started.
func (k *Kubelet) Runs() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.runs
}

// PowerOff kills the member at once (the machine loses power) and runs nothing until PowerOn.
func (k *Kubelet) PowerOff() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.off = true
	if k.p != nil {
		k.p.Kill()
		k.p = nil
	}
}

// Signal sends the running process sig (none running: nothing).
func (k *Kubelet) Signal(sig syscall.Signal) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.p != nil {
		k.p.Signal(sig)
	}
}

// PowerOn lets the manifest's etcd run again (with its data).
func (k *Kubelet) PowerOn() {
	k.mu.Lock()
	k.off = false
	k.mu.Unlock()
	k.sync()
}

// Process is the member's current run (nil when none runs).
func (k *Kubelet) Process() *proc.Process {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.p
}

// Logs is the output of the member's current run ("" when none runs).
func (k *Kubelet) Logs() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.p == nil {
		return ""
	}
	return k.p.Logs()
}
