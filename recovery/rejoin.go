package recovery

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Joiner is a layout that can start its member as a new member of an existing cluster.
type Joiner interface {
	// Join sets the member's start-up flags for joining: --initial-cluster, and
	// --initial-cluster-state=existing. It is called while the member is stopped.
	Join(initialCluster string) error
}

// Joined is what Rejoin did.
type Joined struct {
	Member, ClusterID string
	// Members is how many members the cluster has now; Aside where the old data went ("" when there
	// was none).
	Members int
	Aside   string
}

// Rejoin adds this node's member (self) back to the rebuilt cluster, reached at cluster (its client
// URLs), as etcd's runtime reconfiguration has it: the member stopped, its old data moved aside (kept,
// never deleted), added as a learner (it votes only once promoted, so a member that never catches up
// costs no quorum), started on an empty data directory with --initial-cluster-state=existing, and
// promoted once it has caught up. Run it on each lost member's machine once it is back, one machine at
// a time. Every step can be run again: a rerun finds in the cluster's membership how far it got.
func Rejoin(ctx context.Context, n Node, p Plan, self Member, cluster []string) (*Joined, error) {
	if err := p.Ready(); err != nil {
		return nil, err
	}
	joiner, ok := n.Layout.(Joiner)
	switch {
	case self.Name == "" || self.PeerURL == "":
		return nil, errors.New("this member's name and peer URL are needed: the etcd manifest's --name and --initial-advertise-peer-urls")
	case self.Name == p.Survivor.Member:
		return nil, fmt.Errorf("%s is the plan's survivor: its part is `agent recover`; run this on the other members' machines", self.Name)
	case !ok:
		return nil, fmt.Errorf("%s: set the member's --initial-cluster and --initial-cluster-state=existing by hand; rejoining changes a static pod's manifest only", n.Layout)
	case len(cluster) == 0:
		return nil, errors.New("the rebuilt cluster's client URLs are needed (the survivor's, e.g. https://10.0.0.3:2379)")
	}
	n = n.withDefaults()
	j, err := openJournal(n.StateDir) // its lock: one recovery or rejoin on a node at a time
	if err != nil {
		return nil, err
	}
	defer j.close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster, TLS: n.TLS, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd at %s: %w", strings.Join(cluster, ","), err)
	}
	defer cli.Close()
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	g, err := cli.Get(gctx, "hale-rejoin-check")
	cancel()
	if err != nil {
		return nil, fmt.Errorf("the rebuilt cluster at %s does not answer a linearizable read (%w): rejoin once `agent recover` is done on the survivor", strings.Join(cluster, ","), err)
	}
	r := &Record{Token: p.Token, Member: self.Name, PeerURL: self.PeerURL, DataDir: n.DataDir, NewClusterID: hexID(g.Header.ClusterId)}
	if r.NewClusterID == p.Survivor.ClusterID {
		return nil, fmt.Errorf("%s answers as the old etcd cluster %s: rebuild it first (`agent recover` on %s)", strings.Join(cluster, ","), r.NewClusterID, p.Survivor.Member)
	}
	ml, err := cli.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the rebuilt cluster's members: %w", err)
	}
	if !slices.ContainsFunc(ml.Members, func(m *etcdserverpb.Member) bool { return m.Name == p.Survivor.Member }) {
		return nil, fmt.Errorf("etcd cluster %s at %s has no member %s, the plan's survivor: it is not the cluster rebuilt from this plan",
			r.NewClusterID, strings.Join(cluster, ","), p.Survivor.Member)
	}
	out := &Joined{Member: self.Name, ClusterID: r.NewClusterID}
	if m := memberWithPeerURL(ml.Members, self.PeerURL); m != nil && m.Name == self.Name {
		say(n, r, "%s has started in etcd cluster %s already", self.Name, r.NewClusterID)
		if err := n.Layout.Start(ctx); err != nil { // a rerun cut short before the start returned
			return nil, err
		}
	} else {
		if err := stop(ctx, n, r); err != nil {
			return nil, err
		}
		// The member may have been starting (a machine just powered on): not listening yet, its
		// database not open yet, and still creating member/ as the kubelet stops it.
		if err := settle(ctx, n, r, time.Second); err != nil {
			return nil, err
		}
		if out.Aside, err = moveAside(n, r); err != nil {
			return nil, err
		}
		say(n, r, "adding %s (%s) to etcd cluster %s as a learner", self.Name, self.PeerURL, r.NewClusterID)
		initial, err := AddLearner(ctx, cli, self.Name, self.PeerURL, n.StartTimeout)
		if err != nil {
			return nil, err
		}
		if err := joiner.Join(initial); err != nil {
			return nil, err
		}
		say(n, r, "starting %s on an empty data directory to join %s (%s)", self.Name, initial, n.Layout)
		if err := n.Layout.Start(ctx); err != nil {
			return nil, err
		}
	}
	say(n, r, "promoting %s to a voter once it has caught up with the leader", self.Name)
	if err := Promote(ctx, cli, self.Name, n.StartTimeout); err != nil {
		return nil, err
	}
	if ml, err = cli.MemberList(ctx); err != nil {
		return nil, fmt.Errorf("listing the rebuilt cluster's members: %w", err)
	}
	out.Members = len(ml.Members)
	say(n, r, "%s is a voter of etcd cluster %s, one of %d members", self.Name, r.NewClusterID, out.Members)
	// A member that joined as a learner serves its clients only once it has published itself, which
	// etcd retries after the promotion (7 s later, seen with etcd 3.6): the node's agent and API server
	// are its clients.
	if err := servesClients(ctx, n, r); err != nil {
		return out, err
	}
	// A machine that was not fenced (a member that answered, behind the survivor) still runs its
	// control plane on a cache of the old data.
	if err := restartControlPlane(ctx, n, r); err != nil {
		return out, err
	}
	return out, nil
}

// settle waits until, for quiet on end, nothing has listened at the member's client URL, held its
// database, or run with this data directory on its command line (within the stop timeout).
func settle(ctx context.Context, n Node, r *Record, quiet time.Duration) error {
	deadline := time.Now().Add(n.StopTimeout)
	since := time.Now()
	for time.Since(since) < quiet {
		if answers(ctx, n.Endpoint) || heldByAnother(filepath.Join(r.DataDir, "member", "snap", "db")) || runsOn(r.DataDir) {
			since = time.Now()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd still runs on %s %s after the member was asked to stop: stop it by hand", r.DataDir, n.StopTimeout)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// moveAside moves the data directory's member/ (the old cluster's data, or what an earlier try
// started) aside under the data directory, into a directory of its own; nothing is deleted. It
// returns where it went ("" when there was no member/).
func moveAside(n Node, r *Record) (string, error) {
	from := filepath.Join(r.DataDir, "member")
	if _, err := os.Stat(from); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	to := filepath.Join(r.DataDir, "hale-aside-"+r.Token)
	for i := 2; ; i++ {
		if _, err := os.Stat(to); errors.Is(err, fs.ErrNotExist) {
			break
		}
		to = filepath.Join(r.DataDir, fmt.Sprintf("hale-aside-%s-%d", r.Token, i))
	}
	say(n, r, "moving %s aside to %s (kept: remove it once the cluster is healthy and backed up)", from, to)
	if err := os.MkdirAll(to, 0o700); err != nil {
		return "", err
	}
	if err := os.Rename(from, filepath.Join(to, "member")); err != nil {
		return "", err
	}
	return to, syncDir(r.DataDir)
}

// Join rewrites the etcd container's flags in the parked manifest (the member is stopped: nothing is
// written in the kubelet's directory, which would run a half-written file) for a member joining an
// existing cluster.
func (s StaticPod) Join(initialCluster string) error {
	err := editManifest(s.Parked, func(pod map[string]any) (bool, error) {
		spec, _ := pod["spec"].(map[string]any)
		containers, _ := spec["containers"].([]any)
		for _, c := range containers {
			c, _ := c.(map[string]any)
			if c == nil || c["name"] != "etcd" {
				continue
			}
			cmd, _ := c["command"].([]any)
			args, _ := c["args"].([]any)
			for _, f := range [][2]string{{"initial-cluster", initialCluster}, {"initial-cluster-state", "existing"}} {
				if !setFlag(cmd, f[0], f[1]) && !setFlag(args, f[0], f[1]) {
					cmd = append(cmd, "--"+f[0]+"="+f[1])
				}
			}
			c["command"] = cmd
			return true, nil
		}
		return false, fmt.Errorf("etcd manifest %s: no container named etcd", s.Parked)
	})
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("the parked etcd manifest (the member must be stopped first): %w", err)
	}
	return err
}

// setFlag sets --name's value in a command line (--name=value or --name value), in place; false when
// the flag is not there.
func setFlag(line []any, name, value string) bool {
	for i, a := range line {
		s, _ := a.(string)
		switch {
		case s == "--"+name && i+1 < len(line):
			line[i+1] = value
			return true
		case strings.HasPrefix(s, "--"+name+"="):
			line[i] = "--" + name + "=" + value
			return true
		}
	}
	return false
}

// servesClients waits until the local member answers its status as a member of the new cluster.
func servesClients(ctx context.Context, n Node, r *Record) error {
	cli, err := n.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(n.StartTimeout)
	for {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(sctx, n.Endpoint)
		cancel()
		if err == nil && hexID(st.Header.ClusterId) == r.NewClusterID {
			say(n, r, "%s serves its clients at %s", r.Member, n.Endpoint)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is a voter but does not serve its clients at %s within %s (last: %v): see the member's log", r.Member, n.Endpoint, n.StartTimeout, err)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}
