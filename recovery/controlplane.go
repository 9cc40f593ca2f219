package recovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"
)

// restartControlPlane restarts the node's control-plane static pods onto the rebuilt cluster, one at
// a time: an API server must not go on serving from its cache of the old data, and the controller
// manager and the scheduler must not keep leader leases from before the loss. Each pod's manifest is
// parked, its process waited out, and the manifest put back. A rerun restarts again what it finds
// parked or running.
func restartControlPlane(ctx context.Context, n Node, r *Record) error {
	for _, p := range n.Restart {
		path := p.Manifest
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			if path = p.Parked; !exists(path) {
				continue // not on this node
			}
		}
		argv, err := podCommand(path)
		if err != nil {
			return err
		}
		say(n, r, "restarting %s onto etcd cluster %s", p, r.NewClusterID)
		if err := p.Stop(ctx); err != nil {
			return err
		}
		parked := time.Now()
		killed := false
		for pids := running(argv); len(pids) > 0; pids = running(argv) {
			if n.KillAfter > 0 && !killed && time.Since(parked) >= n.KillAfter {
				// The kubelet waits out the pod's grace period (kubeadm's API server outlasts its 30
				// s on a real cluster): a graceful shutdown of a process whose cache is of the old
				// data serves nothing here, and it holds the recovery (and the API server) up.
				say(n, r, "%s: its process still runs %s after its manifest was moved out: killing it (SIGKILL; --kill-after)", p, n.KillAfter)
				for _, pid := range pids {
					if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
						return fmt.Errorf("%s: killing its process %d (%s): %w", p, pid, argv[0], err)
					}
				}
				killed = true
			}
			if time.Since(parked) > n.StopTimeout {
				return fmt.Errorf("%s: its process (%s) still runs %s after its manifest was moved out: stop it by hand", p, argv[0], n.StopTimeout)
			}
			if err := sleep(ctx, 100*time.Millisecond); err != nil {
				return err
			}
		}
		if err := markRestarted(p.Parked, r.NewClusterID); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if err := p.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// RestartedAnnotation, on a static pod's manifest, names the etcd cluster it was last restarted
// onto (restartControlPlane).
const RestartedAnnotation = "hale.dev/restarted-onto-etcd-cluster"

// markRestarted writes the new cluster's ID into a parked manifest's annotations, so that the pod put
// back is a new pod to the kubelet. A static pod's UID is a hash of its manifest: put back unchanged
// it is the same pod, and the exited containers of its crash loop while etcd had no quorum keep their
// back-off (up to 5 min): on a real kubeadm node the API server answered 3 min after etcd was
// rebuilt. Written the same again by a rerun, it changes nothing.
func markRestarted(path, clusterID string) error {
	return editManifest(path, func(pod map[string]any) (bool, error) {
		meta, _ := pod["metadata"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
			pod["metadata"] = meta
		}
		annotations, _ := meta["annotations"].(map[string]any)
		if annotations == nil {
			annotations = map[string]any{}
			meta["annotations"] = annotations
		}
		if annotations[RestartedAnnotation] == clusterID {
			return false, nil
		}
		annotations[RestartedAnnotation] = clusterID
		return true, nil
	})
}

// editManifest reads a static pod manifest, lets edit change the pod, and writes it back (synced)
// when edit says it changed it. It keeps what it does not know of the pod.
func editManifest(path string, edit func(pod map[string]any) (changed bool, err error)) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("static pod manifest: %w", err)
	}
	var pod map[string]any
	if err := yaml.Unmarshal(b, &pod); err != nil || pod == nil {
		return fmt.Errorf("static pod manifest %s: not a pod (%v)", path, err)
	}
	changed, err := edit(pod)
	if err != nil || !changed {
		return err
	}
	if b, err = yaml.Marshal(pod); err != nil {
		return fmt.Errorf("static pod manifest %s: %w", path, err)
	}
	if err := writeFileSync(path, b); err != nil {
		return fmt.Errorf("static pod manifest %s: %w", path, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// podCommand is the command line of a static pod's first container (its command, then its args).
func podCommand(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("static pod manifest: %w", err)
	}
	var pod struct {
		Spec struct {
			Containers []struct {
				Command []string `json:"command"`
				Args    []string `json:"args"`
			} `json:"containers"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &pod); err != nil {
		return nil, fmt.Errorf("static pod manifest %s: %w", path, err)
	}
	if len(pod.Spec.Containers) == 0 || len(pod.Spec.Containers[0].Command) == 0 {
		return nil, fmt.Errorf("static pod manifest %s: its first container has no command", path)
	}
	c := pod.Spec.Containers[0]
	return append(c.Command, c.Args...), nil
}

// running are the processes on this host that run argv (its program by base name, then the same
// arguments): a static pod's container shows in the host's /proc as its manifest writes it.
func running(argv []string) []int {
	var pids []int
	for pid, p := range processes() {
		if len(p) == len(argv) && filepath.Base(p[0]) == filepath.Base(argv[0]) && slices.Equal(p[1:], argv[1:]) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// runsOn says whether a process on this host has dataDir as its --data-dir (etcd in a static pod's
// container shows in the host's /proc with kubeadm's path, the same inside and out).
func runsOn(dataDir string) bool {
	for _, p := range processes() {
		if filepath.Clean(memberFromFlags(p).DataDir) == filepath.Clean(dataDir) {
			return true
		}
	}
	return false
}

// processes are the command lines of the host's processes (those that can be read), by pid.
func processes() map[int][]string {
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	out := map[int][]string{}
	for _, path := range paths {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil || len(b) == 0 {
			continue
		}
		out[pid] = strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
	}
	return out
}
