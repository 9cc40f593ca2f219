// Package etcdcluster runs a real multi-member etcd cluster in the test process
// (go.etcd.io/etcd/server/v3/embed) on 127.0.0.1, whose members can be stopped and restarted with
// their data, as a machine's power is cut and restored.
package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/hale-dev/hale/test/proc"
)

// Cluster is a running embedded etcd cluster.
type Cluster struct {
	mu      sync.Mutex
	members []*member
}

type member struct {
	name       string
	dir        string
	clientURL  url.URL
	peerURL    url.URL
	initial    string
	etcd       *embed.Etcd
	clientAddr string
	// starting: a Restart is bringing it up (outside the cluster's lock: a member without a quorum to
	// join takes up to 30 s); stops counts Stop's calls, so that a start a Stop overtook is undone.
	starting bool
	stops    int
}

// Start starts an n-member cluster and stops it when the test ends.
func Start(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c, err := New(tb.TempDir(), n)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// New starts an n-member cluster with its data under dir; Close stops it. Its ports are picked free
// and bound a moment later, so another process (a parallel test package's API server) can take one
// in between, or a loaded machine can keep a member from becoming ready: then it starts again on new
// ports, up to three times.
func New(dir string, n int) (*Cluster, error) {
	var err error
	for attempt := range 3 {
		d := dir
		if attempt > 0 {
			d = filepath.Join(dir, fmt.Sprintf("retry-%d", attempt))
		}
		var c *Cluster
		if c, err = newOnce(d, n); err == nil {
			return c, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) && !strings.Contains(err.Error(), "address already in use") && !errors.Is(err, errNotReady) {
			return nil, err
		}
	}
	return nil, err
}

// errNotReady: a member did not become ready in 30 s (a loaded machine, a peer that never came up):
// the cluster is started again on new ports.
var errNotReady = errors.New("not ready in 30 s")

func newOnce(dir string, n int) (*Cluster, error) {
	c := &Cluster{}
	var initial []string
	for i := range n {
		m := &member{name: fmt.Sprintf("etcd-%d", i), dir: filepath.Join(dir, fmt.Sprintf("etcd-%d", i))}
		client, err := freeAddr()
		if err != nil {
			return nil, err
		}
		peer, err := freeAddr()
		if err != nil {
			return nil, err
		}
		m.clientURL = url.URL{Scheme: "http", Host: client}
		m.peerURL = url.URL{Scheme: "http", Host: peer}
		m.clientAddr = m.clientURL.String()
		initial = append(initial, m.name+"="+m.peerURL.String())
		c.members = append(c.members, m)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, m := range c.members {
		m.initial = strings.Join(initial, ",")
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.etcd, errs[i] = m.start("new")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// start starts the member and waits until it is ready; m.etcd is the caller's to set.
func (m *member) start(state string) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{m.clientURL}, []url.URL{m.clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{m.peerURL}, []url.URL{m.peerURL}
	cfg.InitialCluster = m.initial
	cfg.ClusterState = state
	cfg.InitialClusterToken = "hale-test"
	// No fsync: every member shares one disk with the rest of a test run, and a cold run's gigabytes of
	// build cache can stall an fsync for seconds; a raft loop blocked there has no leader, and every
	// member failed its probes for a minute at a testbed's start (test/demo, once, cold). A member
	// "powered off" here is stopped by this process, so what it wrote is in the page cache either way.
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop()) // stopping members on purpose is noisy
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdcluster: starting %s: %w", m.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		// etcd's Close can block for good on a member whose servers never started serving: give it
		// a while, then leave it behind (a test process; its ports and directory are not reused).
		closed := make(chan struct{})
		go func() { e.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
		}
		return nil, fmt.Errorf("etcdcluster: %s: %w", m.name, errNotReady)
	}
	return e, nil
}

// Endpoints returns every member's client URL, in member order.
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.clientAddr
	}
	return out
}

// Name returns member i's name.
func (c *Cluster) Name(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].name
}

// Stop stops member i (its data stays), as a power cut does; a start under way is undone once it is
// up.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[i]
	m.stops++
	if m.etcd != nil {
		m.etcd.Close()
		m.etcd = nil
	}
}

// Restart starts a stopped member i again from its data. It returns once the member is ready, which
// needs a quorum of members up (nil at once when it runs or is starting already).
func (c *Cluster) Restart(i int) error {
	c.mu.Lock()
	m := c.members[i]
	if m.etcd != nil || m.starting {
		c.mu.Unlock()
		return nil
	}
	m.starting = true
	stops, cfg := m.stops, *m // its settings as they are now (Layout.Join sets them under the lock)
	c.mu.Unlock()
	e, err := cfg.start("existing")
	c.mu.Lock()
	defer c.mu.Unlock()
	m.starting = false
	switch {
	case err != nil:
		return err
	case m.stops != stops: // stopped while it started
		e.Close()
	default:
		m.etcd = e
	}
	return nil
}

// Running reports whether member i is running.
func (c *Cluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].etcd != nil
}

// Wipe stops member i and deletes its data directory, as a disk that dies takes the data with it.
func (c *Cluster) Wipe(i int) error {
	c.Stop(i)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := os.RemoveAll(c.members[i].dir); err != nil {
		return fmt.Errorf("etcdcluster: wiping %s: %w", c.members[i].name, err)
	}
	return nil
}

// DataDir returns member i's data directory; PeerURL its peer URL.
func (c *Cluster) DataDir(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].dir
}

// PeerURL returns member i's peer URL.
func (c *Cluster) PeerURL(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].peerURL.String()
}

// Layout is member i as a node's etcd recovery sees it (the recovery package's Layout and Joiner):
// stopped and started on its data directory the way a kubelet stops and starts a static pod, its
// start-up flags set for joining an existing cluster.
func (c *Cluster) Layout(i int) Layout { return Layout{c: c, i: i} }

// Layout is one member's stop, start and join flags (Cluster.Layout).
type Layout struct {
	c *Cluster
	i int
}

func (l Layout) String() string { return "embedded etcd member " + l.c.Name(l.i) }

// Stop stops the member (stopped already is no error).
func (l Layout) Stop(context.Context) error {
	l.c.Stop(l.i)
	return nil
}

// Start starts it on its data directory and returns once it is ready.
func (l Layout) Start(context.Context) error { return l.c.Restart(l.i) }

// Join sets the member's --initial-cluster for its next start (its state is "existing" at every
// restart already).
func (l Layout) Join(initialCluster string) error {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	l.c.members[l.i].initial = initialCluster
	return nil
}

// Add joins a new member named name the way kubeadm joins one: member add through a running member,
// then start it with the cluster's current peers and state "existing". It returns the new member's
// index once it is ready.
func (c *Cluster) Add(ctx context.Context, name string) (int, error) {
	client, err := freeAddr()
	if err != nil {
		return 0, err
	}
	peer, err := freeAddr()
	if err != nil {
		return 0, err
	}
	m := &member{name: name, clientURL: url.URL{Scheme: "http", Host: client}, peerURL: url.URL{Scheme: "http", Host: peer}}
	m.clientAddr = m.clientURL.String()
	cli, err := c.client()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	resp, err := cli.MemberAdd(ctx, []string{m.peerURL.String()})
	if err != nil {
		return 0, fmt.Errorf("etcdcluster: member add %s: %w", name, err)
	}
	var initial []string
	for _, mm := range resp.Members {
		n := mm.Name
		if mm.ID == resp.Member.ID {
			n = name
		}
		for _, u := range mm.PeerURLs {
			initial = append(initial, n+"="+u)
		}
	}
	m.initial = strings.Join(initial, ",")
	c.mu.Lock()
	defer c.mu.Unlock()
	m.dir = filepath.Join(filepath.Dir(c.members[0].dir), name)
	// The new member checks its initial cluster against the membership a running peer gives it; a
	// peer that has not applied the member add yet (committed, applied a moment later; under load)
	// gives one member fewer ("member count is unequal", once in a full run). kubeadm's join tries
	// again; so does this, for a few seconds.
	for attempt := 1; ; attempt++ {
		if m.etcd, err = m.start("existing"); err == nil {
			break
		}
		if attempt == 10 || !strings.Contains(err.Error(), "member count is unequal") {
			return 0, err
		}
		_ = os.RemoveAll(m.dir)
		time.Sleep(500 * time.Millisecond)
	}
	c.members = append(c.members, m)
	return len(c.members) - 1, nil
}

// Remove takes member i out of the cluster (member remove through a running member) and stops it, as
// Cluster API's KubeadmControlPlane does before it deletes a Machine.
func (c *Cluster) Remove(ctx context.Context, i int) error {
	cli, err := c.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return fmt.Errorf("etcdcluster: member list: %w", err)
	}
	name := c.Name(i)
	for _, mm := range list.Members {
		if mm.Name == name {
			if _, err := cli.MemberRemove(ctx, mm.ID); err != nil {
				return fmt.Errorf("etcdcluster: member remove %s: %w", name, err)
			}
		}
	}
	c.Stop(i)
	return nil
}

// client is a client of the running members.
func (c *Cluster) client() (*clientv3.Client, error) {
	c.mu.Lock()
	var eps []string
	for _, m := range c.members {
		if m.etcd != nil {
			eps = append(eps, m.clientAddr)
		}
	}
	c.mu.Unlock()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcdcluster: a client of %v: %w", eps, err)
	}
	return cli, nil
}

// Close stops every member.
func (c *Cluster) Close() {
	c.mu.Lock()
	n := len(c.members)
	c.mu.Unlock()
	for i := range n {
		c.Stop(i)
	}
}

// freeAddr picks a port below the kernel's ephemeral range (proc.FreeAddr): a member stopped for a
// while restarts on its own ports, and one from the ephemeral range had been taken meanwhile by
// another process's connection (health's TestEtcdViewAndProbe in a full run: "bind: address already
// in use").
func freeAddr() (string, error) {
	a, err := proc.FreeAddr()
	if err != nil {
		return "", fmt.Errorf("etcdcluster: finding a free port: %w", err)
	}
	return a, nil
}
