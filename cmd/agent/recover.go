package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hale-dev/hale/recovery"
)

// recoverFlags are `agent recover`'s.
type recoverFlags struct {
	config, plan, layout, manifest, unit, dataDir, stateDir, endpoint string
	stopTimeout, startTimeout, killAfter                              time.Duration
	// restart are the control-plane static pods restarted once the member answers in the rebuilt cluster.
	restart []string
}

// Layouts `agent recover` knows.
const (
	layoutStaticPod = "static-pod"
	layoutSystemd   = "systemd"
)

func newRecoverCommand(stdout, stderr io.Writer) *cobra.Command {
	var f recoverFlags
	cmd := &cobra.Command{
		Use:   "recover --plan FILE",
		Short: "Rebuild etcd on this node, the survivor, after a permanent loss of quorum (the node's part of `hub recover`)",
		Long: `recover carries out the survivor's part of a recovery from a permanent loss of etcd's quorum, with the
plan the hub wrote once it fenced the lost members (` + "`hub recover --yes`" + `, then ` + "`hub recover -o json > FILE`" + `).

It checks the plan again here, changing nothing if any check fails: this node's member is the plan's
survivor, of the plan's etcd cluster, not behind the plan's raft index; etcd has no quorum (a
linearizable read fails); no fenced member answers at its peer URL. Then it stops the member (kubeadm's
static pod: the manifest is moved out of the kubelet's directory; systemd: the unit is stopped), moves
the data directory's member/ aside (kept, never deleted), restores the member's own database with
etcd's restore (the plan's revision bump, the latest revision marked compacted, the plan's new cluster
token: a new cluster ID), and starts it as a one-member cluster, waiting until it answers. Last, with
kubeadm's static pods, it restarts the API server, the controller manager and the scheduler on this
node (--restart): an API server must not serve from its cache of the old data, and the others must
not keep leader leases from before the loss.

Each step is journaled in --state-dir; run the same command again after a crash and it resumes. One
recovery runs on a node at a time. Run it as root: it moves the manifest and the data directory.

The agent's DaemonSet has no write access to manifests or data directories: run this on the host
(the agent binary is static; without the API server, take it from the image in the node's containerd:
docs/operating.md).`,
		Example: `  agent recover --plan plan.json                      # kubeadm: etcd as a static pod
  agent recover --plan plan.json --layout systemd --unit etcd.service --data-dir /var/lib/etcd`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, p, err := f.node(stdout, stderr)
			if err != nil {
				return err
			}
			r, err := recovery.Recover(cmd.Context(), n, p)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "recovered: %s is etcd cluster %s, one member, at revision %d; its old data is kept in %s\n"+
				"next: `hub resume` now (the hub leaves this survivor alone until its observers see the new cluster healthy, and holds the old members);\n"+
				"then for each other machine, one at a time: repair or replace it (same name and addresses; etcd's certificates and its static pod\n"+
				"manifest as kubeadm writes it; an empty data directory will do), power it on (`hub reboot MACHINE --force`), and run there\n"+
				"`agent rejoin --plan FILE --cluster URL` (URL: this member's client URL); see docs/operating.md, \"Permanent quorum loss\"\n",
				r.Member, r.NewClusterID, r.Revision, r.Aside)
			return nil
		},
	}
	f.register(cmd.Flags(), true)
	return cmd
}

// register adds the flags `agent recover` and `agent rejoin` share (with layouts: --layout, --unit).
func (f *recoverFlags) register(fl *pflag.FlagSet, layouts bool) {
	f.layout = layoutStaticPod
	fl.StringVar(&f.plan, "plan", "", "the recovery plan FILE, from hub recover -o json once hub recover --yes has fenced (required)")
	fl.StringVar(&f.config, "config", "", "the agent's config file, for how to reach etcd (etcd.endpoint, etcd.tls)")
	fl.StringVar(&f.endpoint, "etcd-endpoint", "", "the local member's client URL (default: the config's, or kubeadm's https://127.0.0.1:2379)")
	fl.StringVar(&f.manifest, "manifest", "/etc/kubernetes/manifests/etcd.yaml", "etcd's static pod manifest (its --data-dir is read from it)")
	fl.StringVar(&f.dataDir, "data-dir", "", "the member's data directory (default: the manifest's; with --layout systemd: required)")
	fl.StringVar(&f.stateDir, "state-dir", "/var/lib/hale/recovery", "the recovery's journal and lock, on this node")
	fl.DurationVar(&f.stopTimeout, "stop-timeout", 90*time.Second, "how long the member may take to stop")
	fl.DurationVar(&f.startTimeout, "start-timeout", 5*time.Minute, "how long the member may take to answer after its start (a busy kubelet may take minutes to start a static pod)")
	fl.DurationVar(&f.killAfter, "kill-after", 5*time.Second, "how long a --restart pod's process may take to stop once its manifest is moved out before it is killed "+
		"(SIGKILL: kubeadm's API server outlasts the kubelet's 30-s grace period, holding the recovery up; 0: never kill, the kubelet's grace period is waited out)")
	fl.StringSliceVar(&f.restart, "restart", []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"},
		"the static pods beside etcd's manifest restarted once the member answers in the rebuilt cluster (none: --restart=)")
	if layouts {
		fl.StringVar(&f.layout, "layout", layoutStaticPod, "how etcd runs here: static-pod (kubeadm) or systemd")
		fl.StringVar(&f.unit, "unit", "etcd.service", "with systemd: etcd's unit")
	}
}

// node checks the flags and makes the recovery's view of this node.
// parked is where etcd's manifest waits while the member is stopped: in the state directory.
func (f recoverFlags) parked() string { return filepath.Join(f.stateDir, filepath.Base(f.manifest)) }

// member reads the member from etcd's manifest, or from its parked copy when the manifest is not in
// the kubelet's directory: a run killed while the member was stopped, or a replacement machine whose
// manifest was parked before it was powered on (docs/operating.md).
func (f recoverFlags) member() (recovery.Member, error) {
	path, where := f.manifest, ""
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(f.parked()); err == nil {
			path = f.parked()
		} else {
			where = " (nor is it parked at " + f.parked() + ")"
		}
	}
	m, err := recovery.ManifestMember(path)
	if err != nil {
		return m, fmt.Errorf("--manifest: %w%s", err, where)
	}
	return m, nil
}

func (f recoverFlags) node(stdout, stderr io.Writer) (recovery.Node, recovery.Plan, error) {
	if f.plan == "" {
		return recovery.Node{}, recovery.Plan{}, errors.New("--plan: required (write it with `hub recover -o json > FILE` once `hub recover --yes` has fenced)")
	}
	if f.killAfter < 0 {
		return recovery.Node{}, recovery.Plan{}, fmt.Errorf("--kill-after %s: negative (0 never kills: the kubelet's grace period is waited out)", f.killAfter)
	}
	p, err := recovery.ReadPlan(f.plan)
	if err != nil {
		return recovery.Node{}, recovery.Plan{}, err
	}
	n := recovery.Node{DataDir: f.dataDir, StateDir: f.stateDir, Out: stdout, StopTimeout: f.stopTimeout, StartTimeout: f.startTimeout,
		KillAfter: f.killAfter, Log: slog.New(slog.NewJSONHandler(stderr, nil))}
	switch f.layout {
	case layoutStaticPod:
		m, err := f.member()
		if err != nil {
			return n, p, err
		}
		n.Layout = recovery.StaticPod{Manifest: f.manifest, Parked: f.parked()}
		if n.DataDir == "" {
			n.DataDir = m.DataDir
		}
		for _, pod := range f.restart {
			if pod == "" || strings.ContainsAny(pod, `/\`) {
				return n, p, fmt.Errorf("--restart %q: want the names of static pods beside %s (kube-apiserver, ...)", pod, f.manifest)
			}
			n.Restart = append(n.Restart, recovery.StaticPod{Manifest: filepath.Join(filepath.Dir(f.manifest), pod+".yaml"), Parked: filepath.Join(f.stateDir, pod+".yaml")})
		}
	case layoutSystemd:
		if n.DataDir == "" {
			return n, p, errors.New("--data-dir: required with --layout systemd (etcd's --data-dir, e.g. /var/lib/etcd)")
		}
		n.Layout = recovery.Systemd{Unit: f.unit}
	default:
		return n, p, fmt.Errorf("--layout %q: want %s or %s", f.layout, layoutStaticPod, layoutSystemd)
	}
	cfg, err := loadConfig(f.config)
	if err != nil {
		return n, p, err
	}
	e := cfg.Etcd
	if f.endpoint != "" {
		e.Endpoint = f.endpoint
	}
	e = e.WithDefaults()
	n.Endpoint = e.Endpoint
	if strings.HasPrefix(e.Endpoint, "https://") {
		var tc *tls.Config
		if tc, err = e.TLS.Config(); err != nil {
			return n, p, fmt.Errorf("etcd at %s: %w (etcd.tls in --config)", e.Endpoint, err)
		}
		n.TLS = tc
	}
	return n, p, nil
}

func newRejoinCommand(stdout, stderr io.Writer) *cobra.Command {
	var f recoverFlags
	var cluster []string
	cmd := &cobra.Command{
		Use:   "rejoin --plan FILE --cluster URL,...",
		Short: "Add this node's etcd member back to the cluster rebuilt by `agent recover` (one node at a time)",
		Long: `rejoin grows etcd back after a recovery from a permanent loss of quorum: run it on each lost member's
machine once it is back (repaired, or replaced with the same name and addresses), one machine at a
time, with the plan the survivor was rebuilt from and the rebuilt cluster's client URLs (the
survivor's).

It checks that the cluster at --cluster answers a linearizable read as a new etcd cluster (not the
plan's old one), then stops the local member (its manifest moved out of the kubelet's directory),
moves its data directory's member/ aside (kept, never deleted: it holds the old cluster's data),
adds the member as a learner, rewrites the parked manifest's --initial-cluster and
--initial-cluster-state=existing, starts it on the empty data directory and promotes it to a voter
once it has caught up with the leader. Run again, it finds in the cluster's membership how far it got.

Last, it restarts the API server, the controller manager and the scheduler on this node (--restart):
a machine that was not fenced still runs them on a cache of the old data.

On a replacement machine, park etcd's manifest in --state-dir before powering it on: its kubelet,
which no API server answers yet, would take no pod started from the old manifest down. rejoin reads the
member from the parked copy and puts it in place once its flags are set.

Static pods (kubeadm) only: with a systemd unit, add the member by hand (docs/operating.md). Run it as
root: it moves the manifest and the data directory.`,
		Example:       `  agent rejoin --plan plan.json --cluster https://10.0.0.3:2379   # the survivor's client URL`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(cluster) == 0 {
				return errors.New("--cluster: required (the rebuilt cluster's client URLs: the survivor's, e.g. https://10.0.0.3:2379)")
			}
			n, p, err := f.node(stdout, stderr)
			if err != nil {
				return err
			}
			self, err := f.member()
			if err != nil {
				return err
			}
			j, err := recovery.Rejoin(cmd.Context(), n, p, self, cluster)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "rejoined: %s is a voter of etcd cluster %s, one of %d members\n", j.Member, j.ClusterID, j.Members)
			if j.Aside != "" {
				fmt.Fprintf(stdout, "its old data is kept in %s (remove it once the cluster is healthy and backed up)\n", j.Aside)
			}
			return nil
		},
	}
	f.register(cmd.Flags(), false)
	cmd.Flags().StringSliceVar(&cluster, "cluster", nil, "the rebuilt cluster's client URLs (the survivor's), comma-separated (required)")
	return cmd
}
