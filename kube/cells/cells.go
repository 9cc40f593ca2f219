// Package cells finds the workload clusters a hub in a Cluster API management cluster heals, and runs
// one cell for each: every Cluster labelled hale.dev/heal=true, reached through the kubeconfig Secret
// Cluster API writes for it (<cluster>-kubeconfig, key "value"), as a MachineHealthCheck and a
// KubeadmControlPlane reach it. Cells are started, restarted and stopped as Clusters opt in, out, are
// deleted or get a new kubeconfig, without restarting the hub; each runs on its own, so that a
// workload cluster whose API server hangs, or a cell that fails or panics, holds up no other cell.
package cells

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/health"
)

const (
	// OptInLabel on a Cluster API Cluster, with the value "true", has this hub heal its control plane.
	OptInLabel = "hale.dev/heal"
	// kubeconfigKey is the key of Cluster API's kubeconfig Secret (its util/secret.KubeconfigDataName).
	kubeconfigKey = "value"
	// requestTimeout ends each request to a workload cluster's API server that sets none: one that
	// accepts and never answers holds a cell's call that long at most.
	requestTimeout = 10 * time.Second
)

// Cell is one workload cluster to heal.
type Cell struct {
	Cluster client.ObjectKey
	// Workload is the workload cluster's API, from the kubeconfig Secret (never logged: it holds
	// credentials).
	Workload *rest.Config
}

// KubeconfigSecret is the Secret Cluster API keeps the kubeconfig of Cluster c in.
func KubeconfigSecret(c client.ObjectKey) client.ObjectKey {
	return client.ObjectKey{Namespace: c.Namespace, Name: c.Name + "-kubeconfig"}
}

// Status is what Set.Status says of one opted-in Cluster.
type Status struct {
	Cluster client.ObjectKey
	// Running: its cell runs now. Problem, when not empty, is why it does not, or why its kubeconfig
	// cannot be read now and how its last run ended by itself (it is tried again meanwhile).
	Running bool
	Problem string
}

// Set runs the cells of the opted-in Clusters of the management cluster.
type Set struct {
	// Client is the management cluster's; Namespace, when set, the only one Clusters are looked for in.
	Client    client.Client
	Namespace string
	// Run runs one cell until its context ends, and returns then (its error, if any, is logged). A cell
	// that returns (or panics) before is started again after Retry (default 10 s).
	Run   func(ctx context.Context, c Cell) error
	Retry time.Duration
	Log   *slog.Logger

	mu    sync.Mutex
	cells map[client.ObjectKey]*cell
}

// cell is one Cluster's: its latest run, and what it was started from.
type cell struct {
	hash   [sha256.Size]byte // of the kubeconfig it runs with
	cancel context.CancelFunc
	done   chan struct{} // closed when its run returned; nil: not started
	ended  time.Time
	// secret: why it cannot run now (its kubeconfig cannot be read, its pool is another's); failed: how its last run that ended by itself
	// ended (kept while it is tried again, so that a cell that keeps failing says so).
	secret, failed string
}

func (c *cell) problem() string {
	switch {
	case c.secret == "":
		return c.failed
	case c.failed == "":
		return c.secret
	}
	return c.secret + "; " + c.failed
}

func (c *cell) running() bool {
	if c.done == nil {
		return false
	}
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// Loop syncs every interval until ctx ends, then stops every cell and waits for them (at most 10 s,
// then says which did not stop).
func (s *Set) Loop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := s.Sync(ctx); err != nil && ctx.Err() == nil {
			s.log().Warn("finding the Clusters to heal", "err", err)
		}
		select {
		case <-ctx.Done():
			s.stopAll()
			return
		case <-t.C:
		}
	}
}

// Sync reads the opted-in Clusters and their kubeconfigs once, starts the cells that should run and
// do not, and stops those of Clusters that opted out or are being deleted. A cell is never run twice
// at once: one whose kubeconfig changed is stopped, and started again with the new one once it has
// returned (a later Sync). A running cell whose Secret cannot be read now goes on with what it has.
func (s *Set) Sync(ctx context.Context) error {
	var clusters clusterv1.ClusterList
	if err := s.Client.List(ctx, &clusters, client.InNamespace(s.Namespace), client.MatchingLabels{OptInLabel: "true"}); err != nil {
		return fmt.Errorf("listing Cluster API Clusters labelled %s=true: %w", OptInLabel, err)
	}
	want := map[client.ObjectKey]wanted{}
	problems := map[client.ObjectKey]string{}
	// Two Clusters that name one gossip pool cannot both be served on the hub's port: the older keeps
	// it, the same one after every restart or failover of the hub (started in turn, whichever cell
	// reached the port first won it, and a failover under load once gave a healthy Cluster's pool to
	// the newer one that named it by mistake).
	slices.SortFunc(clusters.Items, func(a, b clusterv1.Cluster) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(client.ObjectKeyFromObject(&a).String(), client.ObjectKeyFromObject(&b).String()))
	})
	pools, pooled := map[string]client.ObjectKey{}, map[client.ObjectKey]bool{} // pooled: another's pool
	for _, c := range clusters.Items {
		key := client.ObjectKeyFromObject(&c)
		if c.DeletionTimestamp != nil {
			continue // being deleted: its machines go with it
		}
		pool := GossipName(&c)
		if older, taken := pools[pool]; taken {
			problems[key], pooled[key] = fmt.Sprintf("its gossip pool %q is older Cluster API Cluster %s's: each cluster's pool needs a name of its own (annotation %s)",
				pool, older, GossipNameAnnotation), true
			continue
		}
		pools[pool] = key
		if cfg, hash, err := s.workload(ctx, key); err != nil {
			problems[key] = err.Error()
		} else {
			want[key] = wanted{Cell{Cluster: key, Workload: cfg}, hash}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cells == nil {
		s.cells = map[client.ObjectKey]*cell{}
	}
	for key, c := range s.cells {
		_, wanted := want[key]
		_, troubled := problems[key]
		switch {
		case pooled[key] && c.running():
			c.cancel() // it holds the older Cluster's pool (taken before the older one's cell started)
		case wanted || troubled:
		case c.running():
			c.cancel() // opted out or being deleted
		default:
			delete(s.cells, key)
		}
	}
	for key, p := range problems {
		c := s.cells[key]
		if c == nil {
			c = &cell{}
			s.cells[key] = c
		}
		if c.secret != p {
			s.log().Warn("Cluster API Cluster "+key.String()+": its cell cannot run", "problem", p, "cellRunning", c.running())
		}
		c.secret = p
	}
	for key, want := range want {
		s.start(ctx, key, want)
	}
	return nil
}

func (s *Set) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// wanted is a cell to run, and the hash of the kubeconfig it is reached with.
type wanted struct {
	cell Cell
	hash [sha256.Size]byte
}

// start runs cell key as w says unless its run with the same kubeconfig goes on; a run with another
// one is stopped first (and w started by a later Sync). Called with s.mu held.
func (s *Set) start(ctx context.Context, key client.ObjectKey, w wanted) {
	want, hash := w.cell, w.hash
	c := s.cells[key]
	switch {
	case c == nil:
		c = &cell{}
		s.cells[key] = c
	case c.running() && c.hash == hash:
		c.secret = "" // its Secret is readable again, unchanged
		return
	case c.running():
		c.cancel() // a new kubeconfig: the old run stops first
		return
	case c.done != nil && c.hash == hash && time.Since(c.ended) < cmp.Or(s.Retry, 10*time.Second):
		return // ended by itself a moment ago: not at once again
	}
	cctx, cancel := context.WithCancel(ctx)
	c.hash, c.cancel, c.done, c.secret = hash, cancel, make(chan struct{}), ""
	s.log().Info("healing Cluster API Cluster "+key.String(), "workload", want.Workload.Host)
	go s.run(cctx, key, want, c)
}

// run is one run of a cell: a panic ends it as an error would, never the hub.
func (s *Set) run(ctx context.Context, key client.ObjectKey, want Cell, c *cell) {
	var err error
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
		s.mu.Lock()
		c.ended = time.Now()
		if err != nil && ctx.Err() == nil {
			c.failed = fmt.Sprintf("its cell ended at %s: %v", c.ended.UTC().Format(time.TimeOnly+"Z"), err)
		}
		close(c.done)
		s.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			s.log().Error("the cell of Cluster API Cluster "+key.String()+" ended", "err", err)
		}
	}()
	err = s.Run(ctx, want)
	if err == nil && ctx.Err() == nil {
		err = errors.New("returned while it should run")
	}
}

// stopAll stops every cell and waits for them, 10 s at most.
func (s *Set) stopAll() {
	s.mu.Lock()
	var done []chan struct{}
	for _, c := range s.cells {
		if c.cancel != nil {
			c.cancel()
			done = append(done, c.done)
		}
	}
	s.mu.Unlock()
	deadline := time.After(10 * time.Second)
	for _, d := range done {
		select {
		case <-d:
		case <-deadline:
			s.log().Warn("a cell did not stop within 10 s", "running", s.runningNames())
			return
		}
	}
}

func (s *Set) runningNames() []string {
	var names []string
	for _, st := range s.Status() {
		if st.Running {
			names = append(names, st.Cluster.String())
		}
	}
	return names
}

// Status lists every opted-in Cluster the last Sync found, and the cells still running, by name.
func (s *Set) Status() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Status
	for _, key := range slices.SortedFunc(maps.Keys(s.cells), func(a, b client.ObjectKey) int { return cmp.Compare(a.String(), b.String()) }) {
		c := s.cells[key]
		out = append(out, Status{Cluster: key, Running: c.running(), Problem: c.problem()})
	}
	return out
}

// workload reads Cluster key's kubeconfig Secret, and hashes it (a change of any byte is a new
// kubeconfig); an error names the Secret and what to do, never what the Secret holds.
func (s *Set) workload(ctx context.Context, key client.ObjectKey) (*rest.Config, [sha256.Size]byte, error) {
	sk := KubeconfigSecret(key)
	var secret corev1.Secret
	if err := s.Client.Get(ctx, sk, &secret); apierrors.IsNotFound(err) {
		return nil, [sha256.Size]byte{}, fmt.Errorf("no Secret %s: Cluster API writes it once the control plane is initialized (or give this hub's "+
			"ServiceAccount get on Secrets in %s)", sk, sk.Namespace)
	} else if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("reading Secret %s: %w", sk, err)
	}
	data := secret.Data[kubeconfigKey]
	if len(data) == 0 {
		return nil, [sha256.Size]byte{}, fmt.Errorf("kubeconfig Secret %s has no key %q: not a Cluster API kubeconfig Secret", sk, kubeconfigKey)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		// The parser's message may quote the Secret's content (credentials): not repeated.
		return nil, [sha256.Size]byte{}, fmt.Errorf("kubeconfig Secret %s: key %q does not parse as a kubeconfig", sk, kubeconfigKey)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = requestTimeout
	}
	return cfg, sha256.Sum256(data), nil
}

// GossipNameAnnotation on an opted-in Cluster names its agents' gossip pool (their --cluster), when it
// is not NAMESPACE/NAME: the cell's pool on the hub's shared gossip port has that name.
const GossipNameAnnotation = "hale.dev/gossip-cluster"

// GossipName is the name of Cluster cl's gossip pool.
func GossipName(cl *clusterv1.Cluster) string {
	return cmp.Or(cl.Annotations[GossipNameAnnotation], client.ObjectKeyFromObject(cl).String())
}

// GossipKeySecret is the Secret holding Cluster c's gossip keys (key "key", as the agents' key file:
// one base64 key a line), which its agents in the workload cluster are given too.
func GossipKeySecret(c client.ObjectKey) client.ObjectKey {
	return client.ObjectKey{Namespace: c.Namespace, Name: c.Name + "-hale-gossip"}
}

// GossipKeys reads Cluster c's gossip keys; an error names the Secret, never a key.
func GossipKeys(ctx context.Context, cl client.Client, c client.ObjectKey) ([][]byte, error) {
	sk := GossipKeySecret(c)
	var secret corev1.Secret
	if err := cl.Get(ctx, sk, &secret); err != nil {
		return nil, fmt.Errorf("the gossip keys of Cluster API Cluster %s: Secret %s: %w (create it with the key its agents have: "+
			"kubectl -n %s create secret generic %s --from-file=key=KEYFILE)", c, sk, err, sk.Namespace, sk.Name)
	}
	return health.ParseGossipKeys(secret.Data["key"], fmt.Sprintf("Secret %s, key %q", sk, "key"))
}
