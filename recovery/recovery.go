package recovery

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Node is the survivor's machine as `agent recover` finds it.
type Node struct {
	// Endpoint is the local member's client URL, TLS how to reach it (nil for http://).
	Endpoint string
	TLS      *tls.Config
	Layout   Layout
	// DataDir is the member's data directory (its member/ is moved aside and replaced).
	DataDir string
	// StateDir holds the journal (recovery.json), the lock, and a parked static pod manifest.
	StateDir string
	// Restart are the node's control-plane static pods (kubeadm: kube-apiserver, the controller
	// manager, the scheduler), restarted once the rebuilt member answers; those whose manifest is not
	// there are not on this node.
	Restart []StaticPod
	Log     *slog.Logger
	// Out gets one line per step for the operator.
	Out io.Writer
	// Timeouts: for the member to stop (its client port closed and its database let go), and to
	// answer after the start.
	StopTimeout, StartTimeout time.Duration
	// KillAfter, when set, is how long a restarted static pod's process (Restart) may take to stop
	// once its manifest is moved out before it is killed; unset, the kubelet's grace period is waited out.
	KillAfter time.Duration
	// journaled, when set, is called after each step is journaled (the crash test's child stops
	// there to be killed).
	journaled func(Step)
}

// withDefaults fills in what was left unset: the timeouts, no log, no output.
func (n Node) withDefaults() Node {
	n.StopTimeout = cmp.Or(n.StopTimeout, 90*time.Second)
	n.StartTimeout = cmp.Or(n.StartTimeout, 5*time.Minute)
	if n.Log == nil {
		n.Log = slog.New(slog.DiscardHandler)
	}
	if n.Out == nil {
		n.Out = io.Discard
	}
	return n
}

// Recover carries out the plan on this node, resuming a journaled recovery of the same plan. It
// returns the journal's record once the one-member cluster answers.
func Recover(ctx context.Context, n Node, p Plan) (*Record, error) {
	if err := p.Ready(); err != nil {
		return nil, err
	}
	n = n.withDefaults()
	j, err := openJournal(n.StateDir)
	if err != nil {
		return nil, err
	}
	defer j.close()
	r, err := j.read()
	if err != nil {
		return nil, err
	}
	switch {
	case r == nil:
		if r, err = check(ctx, n, p); err != nil {
			return nil, err
		}
		if err := n.write(j, r); err != nil {
			return nil, err
		}
		say(n, r, "every precondition holds on this node: %s is the survivor of etcd cluster %s", r.Member, r.OldClusterID)
	case r.Token != p.Token:
		return nil, fmt.Errorf("%s records another recovery (token %s, at step %s since %s): finish it with its own plan; "+
			"move the file away only once you know the state of etcd on this node", j.path(), r.Token, r.Step, r.Updated.Format(time.RFC3339))
	case r.Step == StepDone:
		say(n, r, "this recovery is done already: etcd cluster %s, one member (%s)", r.NewClusterID, r.Member)
		return r, nil
	default:
		say(n, r, "resuming the recovery journaled at step %s", r.Step)
	}
	for _, s := range []struct {
		step Step
		do   func(context.Context, Node, *Record) error
	}{{StepStopped, stop}, {StepAside, aside}, {StepRestored, restore}, {StepStarted, start}, {StepDone, restartControlPlane}} {
		if r.Step.after(s.step) {
			continue
		}
		if err := s.do(ctx, n, r); err != nil {
			return r, fmt.Errorf("recovery step %s (journaled at %s; run the same command again to resume): %w", s.step, r.Step, err)
		}
		r.Step = s.step
		if err := n.write(j, r); err != nil {
			return r, err
		}
	}
	return r, nil
}

// write journals r.
func (n Node) write(j *journal, r *Record) error {
	if err := j.write(r); err != nil {
		return err
	}
	if n.journaled != nil {
		n.journaled(r.Step)
	}
	return nil
}

func say(n Node, r *Record, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	fmt.Fprintf(n.Out, "%s  %s\n", time.Now().UTC().Format("15:04:05"), msg)
	attrs := []any{"token", r.Token}
	if r.Step != "" { // a rejoin has no steps of its own
		attrs = append(attrs, "step", r.Step)
	}
	n.Log.Info(msg, attrs...)
}

// check holds the plan to the node: the local member is the plan's survivor, of its cluster, not
// behind it; quorum is lost from here; no fenced member answers. It changes nothing.
func check(ctx context.Context, n Node, p Plan) (*Record, error) {
	s := p.Survivor
	cli, err := n.client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := cli.Status(sctx, n.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("the local member at %s does not answer (%w): run this on the survivor %s (%s), with its etcd running", n.Endpoint, err, s.Member, s.Machine)
	}
	ml, err := cli.MemberList(sctx, clientv3.WithSerializable())
	if err != nil {
		return nil, fmt.Errorf("the local member at %s: listing members: %w", n.Endpoint, err)
	}
	r := &Record{Token: p.Token, OldClusterID: hexID(st.Header.ClusterId), DataDir: n.DataDir, Bump: p.BumpRevision, Started: time.Now().UTC(), Step: StepChecked}
	peers := map[string][]string{}
	for _, m := range ml.Members {
		peers[m.Name] = m.PeerURLs
		if m.ID == st.Header.MemberId {
			r.Member = m.Name
			if len(m.PeerURLs) > 0 {
				r.PeerURL = m.PeerURLs[0]
			}
		}
	}
	r.Aside = filepath.Join(n.DataDir, "hale-aside-"+p.Token)
	switch {
	case r.Member != s.Member:
		return nil, fmt.Errorf("the local member is %q, the plan's survivor is %q (%s): run this on %s", r.Member, s.Member, s.Machine, cmp.Or(s.Machine, s.Member))
	case r.OldClusterID != s.ClusterID:
		return nil, fmt.Errorf("the local member is of etcd cluster %s, the plan's survivor of %s: the plan is for another cluster, or etcd was rebuilt since; make a new plan (hub recover)", r.OldClusterID, s.ClusterID)
	case st.RaftIndex < s.Index:
		return nil, fmt.Errorf("the local member is at raft index %d, below the plan's %d: make a new plan (hub recover)", st.RaftIndex, s.Index)
	case r.PeerURL == "":
		return nil, fmt.Errorf("the local member %s has no peer URL in the membership", r.Member)
	}
	if _, err := os.Stat(filepath.Join(n.DataDir, "member", "snap", "db")); err != nil {
		return nil, fmt.Errorf("the member's database is not where the data directory says (%w): give its --data-dir", err)
	}
	qctx, qcancel := context.WithTimeout(ctx, 3*time.Second)
	defer qcancel()
	if _, err := cli.Get(qctx, "hale-recovery-quorum-check"); err == nil {
		return nil, fmt.Errorf("etcd cluster %s has quorum: %s answers a linearizable read, so there is nothing to recover", r.OldClusterID, n.Endpoint)
	}
	for _, f := range p.Fence {
		for _, u := range peers[f.Member] {
			if answers(ctx, u) {
				return nil, fmt.Errorf("%s (%s) answers at its peer URL %s although the plan says it is fenced: power it off (hub recover --yes) and run this again", f.Machine, f.Member, u)
			}
		}
	}
	return r, nil
}

// stop stops the member and waits for its client port to close.
func stop(ctx context.Context, n Node, r *Record) error {
	say(n, r, "stopping %s (%s)", r.Member, n.Layout)
	if err := n.Layout.Stop(ctx); err != nil {
		return err
	}
	deadline := time.Now().Add(n.StopTimeout)
	db := filepath.Join(r.DataDir, "member", "snap", "db")
	for {
		// The client port closes early in etcd's shutdown; the database's lock goes with the process.
		// Nothing is moved before both: a member still writing would write into the copy restored.
		open, locked := answers(ctx, n.Endpoint), heldByAnother(db)
		if !open && !locked {
			return nil
		}
		if time.Now().After(deadline) {
			what := n.Endpoint + " still accepts connections"
			if !open {
				what = "a process still holds " + db
			}
			return fmt.Errorf("%s %s after the member was asked to stop: stop it by hand", what, n.StopTimeout)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// heldByAnother says whether another process holds the lock etcd takes on its database (bbolt's
// flock); false when the file is not there.
func heldByAnother(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

// aside moves the data directory's member/ aside, under the data directory itself (it may be a mount
// point): never deleted, and etcd only warns of it.
func aside(_ context.Context, n Node, r *Record) error {
	from, to := filepath.Join(r.DataDir, "member"), filepath.Join(r.Aside, "member")
	if _, err := os.Stat(to); err == nil {
		if _, err := os.Stat(from); err == nil {
			return fmt.Errorf("both %s and %s exist: find out which is the survivor's data before going on", from, to)
		}
		return nil // moved already
	}
	say(n, r, "moving %s aside to %s (kept: remove it once the cluster is healthy and backed up)", from, to)
	if err := os.MkdirAll(r.Aside, 0o700); err != nil {
		return err
	}
	if err := os.Rename(from, to); err != nil {
		return err
	}
	return syncDir(r.DataDir)
}

// restore restores the survivor's own database into the data directory: written next to it, then
// renamed into place, so a crash never leaves a half-restored member/.
func restore(_ context.Context, n Node, r *Record) error {
	db := filepath.Join(r.Aside, "member", "snap", "db")
	final := filepath.Join(r.DataDir, "member")
	if _, err := os.Stat(final); err == nil {
		return fmt.Errorf("%s exists before the restore (something started etcd on an empty data directory?): move it away by hand, then run this again", final)
	}
	info, err := os.Stat(db)
	if err != nil {
		return fmt.Errorf("the survivor's database: %w", err)
	}
	if err := roomFor(r.DataDir, info.Size()); err != nil {
		return err
	}
	tmp := filepath.Join(r.DataDir, "hale-restoring-"+r.Token)
	if err := os.RemoveAll(tmp); err != nil { // a restore cut short: made again from the database
		return err
	}
	say(n, r, "restoring %s (%d MiB) with revision bump %d, the latest revision marked compacted, cluster token %s", db, info.Size()>>20, r.Bump, r.Token)
	err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        db,
		Name:                r.Member,
		OutputDataDir:       tmp,
		PeerURLs:            []string{r.PeerURL},
		InitialCluster:      r.Member + "=" + r.PeerURL,
		InitialClusterToken: r.Token,
		SkipHashCheck:       true, // a member's own database carries no snapshot hash
		RevisionBump:        r.Bump,
		MarkCompacted:       true,
	})
	if err != nil {
		return fmt.Errorf("etcd's restore of %s: %w", db, err)
	}
	if err := os.Rename(filepath.Join(tmp, "member"), final); err != nil {
		return err
	}
	if err := syncDir(r.DataDir); err != nil {
		return err
	}
	return os.RemoveAll(tmp)
}

// roomFor checks the data directory's file system has room for a copy of the database, with a tenth
// to spare.
func roomFor(dir string, size int64) error {
	var fsStat unix.Statfs_t
	if err := unix.Statfs(dir, &fsStat); err != nil {
		return fmt.Errorf("free space in %s: %w", dir, err)
	}
	free := int64(fsStat.Bavail) * int64(fsStat.Bsize)
	if need := size + size/10; free < need {
		return fmt.Errorf("%s has %d MiB free, the restored database needs %d MiB: make room (the old data stays aside)", dir, free>>20, need>>20)
	}
	return nil
}

// start starts the member on the restored data and waits for it to answer a linearizable read as a
// one-member cluster with a new cluster ID.
func start(ctx context.Context, n Node, r *Record) error {
	say(n, r, "starting %s as a one-member cluster (%s)", r.Member, n.Layout)
	// Put back unchanged: to the kubelet it is the pod it stopped (a static pod's UID is a hash of its
	// manifest), which it starts again once its housekeeping has finished with it (2 to 4 s in most
	// runs on the kubeadm lab). A changed manifest is a new pod, which the kubelet starts only once the
	// old one of the same name has terminated completely: 71 s in the one run that tried it.
	if err := n.Layout.Start(ctx); err != nil {
		return err
	}
	deadline := time.Now().Add(n.StartTimeout)
	// The client is made once the port accepts connections: gRPC's reconnect backoff would otherwise
	// add seconds after a first refused dial.
	for !answers(ctx, n.Endpoint) && time.Now().Before(deadline) {
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	cli, err := n.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	var last error
	for time.Now().Before(deadline) {
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		g, err := cli.Get(gctx, "hale-recovery-check")
		var ml *clientv3.MemberListResponse
		if err == nil {
			ml, err = cli.MemberList(gctx)
		}
		cancel()
		switch {
		case err != nil:
			last = err
		case hexID(g.Header.ClusterId) == r.OldClusterID:
			return fmt.Errorf("%s answers as the old etcd cluster %s: it did not start on the restored data; check the data directory %s", n.Endpoint, r.OldClusterID, r.DataDir)
		case len(ml.Members) != 1:
			return fmt.Errorf("%s answers with %d members, not one: check the data directory %s", n.Endpoint, len(ml.Members), r.DataDir)
		default:
			r.NewClusterID, r.Revision = hexID(g.Header.ClusterId), g.Header.Revision
			say(n, r, "%s answers: etcd cluster %s, one member, revision %d (was at most %d)", r.Member, r.NewClusterID, r.Revision, r.Revision-int64(r.Bump))
			return nil
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
	if last == nil {
		// The port never accepted a connection: the member did not start (a kubelet that has not
		// started its static pod yet, a container that exits at once).
		return fmt.Errorf("%s accepted no connection within %s after the start: the member did not start (%s); see its log "+
			"(kubeadm: `crictl ps -a --name etcd`, `crictl logs`, the kubelet's journal), then run the same command again", n.Endpoint, n.StartTimeout, n.Layout)
	}
	return fmt.Errorf("%s did not answer a read within %s after the start (last: %w): see the member's log", n.Endpoint, n.StartTimeout, last)
}

func (n Node) client() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{n.Endpoint}, TLS: n.TLS, DialTimeout: 3 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd at %s: %w", n.Endpoint, err)
	}
	return cli, nil
}

// answers says whether something accepts TCP connections at the URL's host and port.
func answers(ctx context.Context, rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return false
	}
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// sleep waits d, or until ctx ends (its error).
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func hexID(id uint64) string { return strconv.FormatUint(id, 16) }
