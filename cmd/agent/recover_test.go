package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// `agent recover` refuses bad input with an error that names what is wrong, before it touches
// anything (the recovery itself runs against real etcd members in recovery/).
func TestRecoverCommandErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	ready := write("plan.json", `{"survivor": {"member": "etcd-1", "clusterID": "c1", "index": 10}, "bumpRevision": 10000, "token": "hale-c1-1",
		"fence": [{"machine": "cp-2", "member": "etcd-2", "fenced": true}]}`)
	manifest := write("etcd.yaml", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: etcd\n    command: [etcd, --name=etcd-1, --data-dir=/nonexistent/etcd]\n")
	member2 := write("etcd-2.yaml", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: etcd\n    command: [etcd, --name=etcd-2, --data-dir=/nonexistent/etcd,"+
		" --initial-advertise-peer-urls=http://127.0.0.1:2]\n")
	survivor := write("etcd-1.yaml", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: etcd\n    command: [etcd, --name=etcd-1, --data-dir=/nonexistent/etcd,"+
		" --initial-advertise-peer-urls=http://127.0.0.1:3]\n")
	parkedIn := filepath.Join(dir, "parked-state")
	require.NoError(t, os.MkdirAll(parkedIn, 0o755))
	b, err := os.ReadFile(member2)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(parkedIn, "etcd-2.yaml"), b, 0o600))
	rejoin := func(args ...string) []string {
		return append([]string{"rejoin", "--plan", ready, "--state-dir", filepath.Join(dir, "state"), "--etcd-endpoint", "http://127.0.0.1:1"}, args...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no plan", []string{}, "--plan: required"},
		{"no such plan", []string{"--plan", filepath.Join(dir, "none.json")}, "recovery plan: open"},
		{"not JSON", []string{"--plan", write("bad.json", "survivor: x")}, "write it with `hub recover --yes -o json > FILE`"},
		{"a plan only", []string{"--plan", write("plan-only.json", `{"survivor": {"member": "etcd-1", "clusterID": "c1"}, "bumpRevision": 10000}`)},
			"no new cluster token: it was not made by `hub recover --yes`"},
		{"not ready", []string{"--plan", write("blocked.json", `{"survivor": {"member": "etcd-1", "clusterID": "c1"}, "token": "t", "bumpRevision": 1, "blockers": ["cp-2 powered on"]}`)},
			"it is not ready: cp-2 powered on"},
		{"not fenced", []string{"--plan", write("unfenced.json", `{"survivor": {"member": "etcd-1", "clusterID": "c1"}, "token": "t", "bumpRevision": 1,
			"fence": [{"machine": "cp-2", "member": "etcd-2", "how": "its BMC does not answer"}]}`)}, "cp-2 (etcd-2) is not fenced: run `hub recover --yes` again"},
		{"no bump", []string{"--plan", write("nobump.json", `{"survivor": {"member": "etcd-1", "clusterID": "c1"}, "token": "t"}`)}, "bumpRevision is 0"},
		{"bad layout", []string{"--plan", ready, "--layout", "docker"}, `--layout "docker": want static-pod or systemd`},
		{"systemd without a data directory", []string{"--plan", ready, "--layout", "systemd"}, "--data-dir: required with --layout systemd"},
		{"no manifest", []string{"--plan", ready, "--manifest", filepath.Join(dir, "none.yaml")}, "--manifest: etcd manifest: open"},
		{"a manifest without etcd", []string{"--plan", ready, "--manifest", write("pod.yaml", "spec:\n  containers:\n  - name: nginx\n")}, "no container named etcd"},
		{"no local member", []string{"--plan", ready, "--manifest", manifest, "--state-dir", filepath.Join(dir, "state"), "--etcd-endpoint", "http://127.0.0.1:1"},
			"the local member at http://127.0.0.1:1 does not answer"},
		{"rejoin: no cluster", rejoin("--manifest", member2), "--cluster: required"},
		{"rejoin: no plan", []string{"rejoin", "--cluster", "http://127.0.0.1:1"}, "--plan: required"},
		{"rejoin: no layout but the static pod", rejoin("--layout", "systemd"), "unknown flag: --layout"},
		{"rejoin: no peer URL in the manifest", rejoin("--manifest", manifest, "--cluster", "http://127.0.0.1:1"), "name and peer URL are needed"},
		{"rejoin: on the survivor", rejoin("--manifest", survivor, "--cluster", "http://127.0.0.1:1"), "etcd-1 is the plan's survivor: its part is `agent recover`"},
		{"rejoin: the rebuilt cluster does not answer", rejoin("--manifest", member2, "--cluster", "http://127.0.0.1:1"),
			"the rebuilt cluster at http://127.0.0.1:1 does not answer a linearizable read"},
		// A replacement's manifest parked in the state directory before power-on (docs/operating.md):
		// read from there, and the rejoin goes on to the cluster.
		{"rejoin: the manifest parked", []string{"rejoin", "--plan", ready, "--state-dir", parkedIn, "--etcd-endpoint", "http://127.0.0.1:1",
			"--manifest", filepath.Join(dir, "manifests", "etcd-2.yaml"), "--cluster", "http://127.0.0.1:1"},
			"the rebuilt cluster at http://127.0.0.1:1 does not answer a linearizable read"},
		{"rejoin: the manifest neither there nor parked", rejoin("--manifest", filepath.Join(dir, "manifests", "etcd-3.yaml"), "--cluster", "http://127.0.0.1:1"),
			"(nor is it parked at " + filepath.Join(dir, "state", "etcd-3.yaml") + ")"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if len(args) == 0 || args[0] != "rejoin" {
				args = append([]string{"recover"}, args...)
			}
			err := run(context.Background(), args, io.Discard, io.Discard, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err = os.Stat(filepath.Join(dir, "state", "recovery.json"))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing journaled when a check fails")
	_, err = os.Stat(member2)
	assert.NoError(t, err, "the manifest stays where it was when rejoin refuses")
}
