package recovery

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// Layout is how etcd runs on the node: what stops its member and what starts it again.
type Layout interface {
	// Stop asks for the member to stop (the caller waits for its client port to close); done
	// already is no error.
	Stop(ctx context.Context) error
	// Start asks for it to start again on its data directory.
	Start(ctx context.Context) error
	String() string
}

// StaticPod is kubeadm's layout: etcd is a static pod whose manifest the kubelet runs. Stopping moves
// the manifest out of the kubelet's directory (the kubelet then stops the pod), starting moves it back.
type StaticPod struct {
	// Manifest is the pod's manifest (kubeadm: /etc/kubernetes/manifests/etcd.yaml); Parked is where
	// it waits while the member is stopped (outside the kubelet's directory).
	Manifest, Parked string
}

func (s StaticPod) String() string { return "static pod " + s.Manifest }

// Stop parks the manifest.
func (s StaticPod) Stop(context.Context) error {
	if _, err := os.Stat(s.Manifest); errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(s.Parked); err == nil {
			return nil // parked already
		}
		return fmt.Errorf("%s: neither the manifest nor its parked copy %s is there", s, s.Parked)
	}
	return moveSync(s.Manifest, s.Parked)
}

// Start puts the manifest back.
func (s StaticPod) Start(context.Context) error {
	if _, err := os.Stat(s.Parked); errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(s.Manifest); err == nil {
			return nil // back already
		}
		return fmt.Errorf("%s: neither the manifest nor its parked copy %s is there", s, s.Parked)
	}
	return moveSync(s.Parked, s.Manifest)
}

// moveSync moves a file across directories (a copy, synced, then the original removed: the manifest
// directory and the state directory may be on different file systems).
func moveSync(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := writeFileSync(to, b); err != nil {
		return fmt.Errorf("moving %s to %s: %w", from, to, err)
	}
	if err := os.Remove(from); err != nil {
		return err
	}
	return syncDir(filepath.Dir(from))
}

// Member is what a node's etcd flags say of its member.
type Member struct {
	Name, DataDir, PeerURL string
}

// ManifestMember reads the member's name, data directory and peer URL from a static pod manifest's
// etcd command line (kubeadm writes them as --flag=value).
func ManifestMember(path string) (Member, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Member{}, fmt.Errorf("etcd manifest: %w", err)
	}
	var pod struct {
		Spec struct {
			Containers []struct {
				Name    string   `json:"name"`
				Command []string `json:"command"`
				Args    []string `json:"args"`
			} `json:"containers"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &pod); err != nil {
		return Member{}, fmt.Errorf("etcd manifest %s: %w", path, err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name != "etcd" {
			continue
		}
		m := memberFromFlags(append(c.Command, c.Args...))
		if m.DataDir == "" || m.Name == "" {
			return Member{}, fmt.Errorf("etcd manifest %s: the etcd container's command has no --name or --data-dir", path)
		}
		return m, nil
	}
	return Member{}, fmt.Errorf("etcd manifest %s: no container named etcd", path)
}

// memberFromFlags reads --name, --data-dir and --initial-advertise-peer-urls (its first URL) from an
// etcd command line, in either --flag=value or --flag value form.
func memberFromFlags(args []string) Member {
	var m Member
	for i, a := range args {
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			continue
		}
		if !ok && i+1 < len(args) {
			value = args[i+1]
		}
		switch name {
		case "name":
			m.Name = value
		case "data-dir":
			m.DataDir = value
		case "initial-advertise-peer-urls":
			m.PeerURL, _, _ = strings.Cut(value, ",")
		}
	}
	return m
}

// Systemd is etcd run by a systemd unit.
type Systemd struct{ Unit string }

func (s Systemd) String() string { return "systemd unit " + s.Unit }

// Stop stops the unit.
func (s Systemd) Stop(ctx context.Context) error { return s.systemctl(ctx, "stop") }

// Start starts the unit.
func (s Systemd) Start(ctx context.Context) error { return s.systemctl(ctx, "start") }

func (s Systemd) systemctl(ctx context.Context, verb string) error {
	out, err := exec.CommandContext(ctx, "systemctl", verb, s.Unit).CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl %s %s: %w: %s", verb, s.Unit, err, strings.TrimSpace(string(out)))
	}
	return nil
}
