// Package cellhub runs one cell of a management-mode hub (kube/cells finds them): the hub of one
// workload Cluster, built from the management cluster's objects and the workload cluster's.
package cellhub

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/health/gossipmux"
	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube"
	"github.com/hale-dev/hale/kube/cells"
	"github.com/hale-dev/hale/kube/claim"
	"github.com/hale-dev/hale/kube/enrol"
	"github.com/hale-dev/hale/kube/outofservice"
)

// Runner runs cells (cells.Set.Run): each a hub of its own for one workload Cluster, with what every cell
// shares (the management cluster, the one gossip port, the hub's identity, the defaults). A cell's
// gossip pool is on Mux (named by cells.GossipName, keyed by cells.GossipKeys); its machines are found across the
// management cluster (Cluster API's and metal3's objects) and its workload cluster (Nodes); its
// journal, requests, Events and HealthPolicy (named after the Cluster) are in the Cluster's
// namespace; its members enrol in its workload cluster, where the hub's key is pinned too.
type Runner struct {
	Client client.Client // the management cluster's
	// Lists is where each cell's requests poll lists its Remediations, Machines and HaleRemediations,
	// its discovery its Machines, MachineHealthChecks and BareMetalHosts, and its policy sync reads
	// its HealthPolicy and Cluster (the management cluster's lists.Shared: one watch a kind for every
	// cell; nil: Client).
	Lists kube.Cache
	Mux   *gossipmux.Mux
	// Node is the hub's gossip name in every pool; Identity its key (nil: identities off), pinned in
	// each workload cluster as PinAs (a name or a prefix* that Node matches).
	Node          string
	Identity      *identity.Identity
	PinAs         string
	AdvertiseAddr string // where the agents reach Mux's port, when not its bind address
	AdvertisePort int
	Policy        pass.Policy // before each HealthPolicy's overrides
	BMC           bmc.Options
	BMCCheckEvery time.Duration // 0: no periodic BMC check
	Keep          int           // finished remediations kept in each journal
	Namespace     string        // Hale's namespace in each workload cluster: its agents', its pinned keys
	Agents, Hubs  []string      // the accounts (in Namespace) whose enrolments pin a node's key, a hub replica's
	AgentPort     int           // the agents' gossip port at the workload's Nodes
	DiscoverEvery time.Duration
	// Claim is the timing of each workload cluster's claim (kube/claim), the Lease ClaimLease in
	// Namespace (default DefaultClaimLease); a cell acts only while it holds it.
	Claim      kube.LeaseTiming
	ClaimLease string
	Log        *slog.Logger
	// Running, when set, is told of a cell's hub and metrics once it runs, and returns what to call
	// when it stops.
	Running func(cluster client.ObjectKey, h *hub.Hub, metrics *prometheus.Registry) (stopped func())
}

// Run runs the hub of one cell until ctx ends, its journal's writes fenced by leader.
func (r *Runner) Run(ctx context.Context, leader *kube.Leader, cell cells.Cell) error {
	key := cell.Cluster
	log := r.Log.With("cluster", key.String())
	wc, err := client.New(cell.Workload, client.Options{Scheme: r.Client.Scheme()})
	if err != nil {
		return fmt.Errorf("the workload cluster's client: %w", err)
	}
	var cl clusterv1.Cluster
	if err := r.Client.Get(ctx, key, &cl); err != nil {
		return fmt.Errorf("reading Cluster API Cluster %s: %w", key, err)
	}
	name := cells.GossipName(&cl)
	d := &kube.Discovery{Client: r.Client, Lists: r.Lists, Workload: wc, ClusterName: key.Name, Namespace: key.Namespace, Log: log,
		Base: pass.Inventory{Cluster: name, Policy: r.Policy}}
	// Found once before the claim is campaigned for, so that a workload cluster that cannot be read
	// says so in the cell's status (and again at each claim: the inventory is found afresh).
	if _, err := d.Build(ctx); err != nil {
		return err
	}
	keys, err := cells.GossipKeys(ctx, r.Client, key)
	if err != nil {
		return err
	}
	gc := health.GossipConfig{Node: r.Node, Cluster: name, Role: "hub", Keys: keys, Identity: r.Identity, Logger: log, Timing: health.DefaultTiming(),
		AdvertiseAddr: r.AdvertiseAddr, AdvertisePort: r.AdvertisePort}
	var pinned *cellPinned
	if r.Identity != nil {
		pk := enrol.PinnedKeys{Client: wc, Key: client.ObjectKey{Namespace: r.Namespace, Name: identity.PinnedConfigMap}}
		if pinned, err = r.pin(ctx, pk, key); err != nil {
			return err
		}
		gc.Pinned = &pinned.keys
	}
	if gc.Transport, err = r.Mux.Pool(name); err != nil {
		return fmt.Errorf("the gossip pool of Cluster API Cluster %s: %w (annotation %s)", key, err, cells.GossipNameAnnotation)
	}
	g, err := health.StartGossip(gc)
	if err != nil {
		_ = gc.Transport.Shutdown()
		return err
	}
	defer func() {
		if err := g.Leave(2 * time.Second); err != nil {
			log.Warn("leaving the gossip pool", "err", err)
		}
		_ = g.Shutdown()
	}()
	go g.JoinLoop(ctx, func() []string {
		peers, err := kube.NodePeers(ctx, wc, r.AgentPort)
		if err != nil {
			log.Warn("finding the agents at the workload cluster's Nodes", "err", err)
		}
		return peers
	})
	policy := client.ObjectKey{Namespace: key.Namespace, Name: key.Name}
	sink := kube.NewEventSink(r.Client, d, r.Node, log)
	sink.Hub = corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HealthPolicy", Namespace: policy.Namespace, Name: policy.Name}
	go sink.Run(ctx)
	// The cell acts only while it holds the workload cluster's claim (kube/claim): the Lease that
	// cluster's own hub, run as a fallback, holds while the cell cannot.
	// Its identity names the Cluster too: two Clusters that name one workload cluster (a mistake, or a
	// move between management clusters) are two candidates for its claim, never one holder twice.
	lease := client.ObjectKey{Namespace: r.Namespace, Name: cmp.Or(r.ClaimLease, DefaultClaimLease)}
	claimant := r.Node + "@" + key.String()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var holding atomic.Bool
	go r.want(cctx, wc, lease, claimant, &holding, log)
	var failed error
	err = kube.Elect(cctx, cell.Workload, wc, lease.Namespace, lease.Name, claimant, r.Claim, func(lctx context.Context, claimed *kube.Leader) {
		holding.Store(true)
		defer holding.Store(false)
		c := claimedCell{cell: key, wc: wc, d: d, policy: policy, sink: sink, pinned: pinned, g: g, leader: leader, claim: claimed, log: log}
		if err := r.heal(lctx, c); err != nil && lctx.Err() == nil {
			failed = err
			cancel()
		}
	}, nil)
	if failed != nil {
		return failed
	}
	return err
}

// DefaultClaimLease is the claim's Lease in each workload cluster (Runner.ClaimLease): the workload
// cluster's own hub's (`hub run --lease`'s default), so that its hub, run there as a fallback, is
// one more candidate for the same right to act.
const DefaultClaimLease = "hale-hub"

// claimedCell is what a cell's run has made once it holds the claim.
type claimedCell struct {
	cell          client.ObjectKey
	wc            client.Client
	d             *kube.Discovery
	policy        client.ObjectKey
	sink          *kube.EventSink
	pinned        *cellPinned
	g             *health.Gossip
	leader, claim *kube.Leader // the management hub's leadership, and the workload cluster's claim
	log           *slog.Logger
}

// heal runs the cell's hub while it holds the claim (until ctx ends): the management cluster's
// journal, fenced by both the management hub's leadership and the claim, each record copied into the
// workload cluster's journal where it has one (a fallback can resume it there).
func (r *Runner) heal(ctx context.Context, c claimedCell) error {
	key, log := c.cell, c.log
	primary := kube.NewJournal(r.Client, key.Namespace, c.leader.Epoch(), r.Keep).ForCluster(key.Name).WithFence(func(ctx context.Context) error {
		if err := c.leader.Check(ctx); err != nil {
			return err
		}
		return c.claim.Check(ctx)
	})
	inv, err := c.d.Build(ctx)
	if err != nil {
		return err
	}
	var h *hub.Hub // (set below, before any journal write)
	var store journal.Store = primary
	workload := kube.NewJournal(c.wc, r.Namespace, c.claim.Epoch(), r.Keep).WithFence(c.claim.Check)
	switch err := c.wc.List(ctx, &v1alpha1.RemediationList{}, client.InNamespace(r.Namespace), client.Limit(1)); {
	case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
		log.Info("claim: no Remediation kind in the workload cluster (no fallback hub installed there): its work is not copied there")
	case err != nil:
		return fmt.Errorf("reading the workload cluster's journal (Remediations in %s): %w", r.Namespace, err)
	default:
		n, err := claim.Pull(ctx, primary, workload, func(node string) string { return machineOfNode(inv, node) })
		if err != nil {
			return err
		}
		if n > 0 {
			log.Info("claim: brought the work its fallback began or carried on", "remediations", n)
		}
		store = &claim.Mirror{Store: primary, Workload: workload, Node: func(machine string) string { return nodeOfMachine(h.Inventory(), machine) }}
	}
	if c.pinned != nil {
		// The workload cluster's agents enrol there, and the cell pins their keys, as a self-hosted
		// hub does in its own cluster.
		e := &enrol.Enroller{Client: c.wc, Pinned: c.pinned.pk, Agents: enrol.Accounts(r.Namespace, r.Agents), Hubs: enrol.Accounts(r.Namespace, r.Hubs), Log: log}
		go e.Run(ctx, func(ctx context.Context) { c.pinned.refresh(ctx, c.g, r, log) })
	}
	reg := prometheus.NewRegistry()
	cfg := hub.Config{Inventory: inv, Gossip: c.g, Log: log, Metrics: prometheus.WrapRegistererWith(prometheus.Labels{"cluster": key.String()}, reg),
		Journal: store, BMC: r.BMC, BMCCheckInterval: r.BMCCheckEvery, OwnerFor: c.d.OwnerFor, Notify: c.sink.Notify,
		Brakes: kube.PolicyBrakes{Client: r.Client, Policy: c.policy, Cache: r.Lists}, Recoveries: kube.PolicyRecoveries{Client: r.Client, Policy: c.policy},
		Marks: kube.PolicyMarks{Client: r.Client, Policy: c.policy}, MarkEvery: pass.CellMarkEvery, Episodes: kube.PolicyEpisodes{Client: r.Client, Policy: c.policy},
		OutOfService: outofservice.Taints{Client: c.wc}}
	if r.BMCCheckEvery == 0 {
		cfg.BMCCheckInterval = -1
	}
	cfg.PowerFor = c.d.PowerFor(cfg.BMCPower)
	if h, err = hub.New(cfg); err != nil {
		return err
	}
	if r.Running != nil {
		defer r.Running(key, h, reg)()
	}
	requests := &kube.RequestSync{Client: r.Client, Lists: r.Lists, Namespace: key.Namespace, Hub: h, Epoch: c.leader.Epoch(), Log: log,
		Machines: true, MachineNamespace: key.Namespace, Cluster: key.Name}
	go requests.Run(ctx)
	c.d.Healthy = kube.HealthyIn(h)
	go c.d.Run(ctx, r.DiscoverEvery, h.SetInventory, log)
	sync := &kube.PolicySync{Client: r.Client, Cache: r.Lists, Policy: c.policy, Cluster: &key, MachineNamespace: key.Namespace, Hub: h, Log: log}
	go sync.Run(ctx)
	log.Info("healing", "machines", len(inv.Machines), "gossip", inv.Cluster, "epoch", c.leader.Epoch(), "claim", c.claim.Epoch())
	return h.Run(ctx)
}

// want marks the claim wanted while the cell does not hold it (every third of its lease duration),
// and says who holds it when that changes.
func (r *Runner) want(ctx context.Context, wc client.Client, lease client.ObjectKey, claimant string, holding *atomic.Bool, log *slog.Logger) {
	every := cmp.Or(r.Claim.LeaseDuration, 15*time.Second) / 3
	said := ""
	for {
		if !holding.Load() {
			h, err := claim.Want(ctx, wc, lease, claimant)
			if err != nil && ctx.Err() == nil {
				log.Warn("claim: cannot mark it wanted", "err", err)
			}
			if h != "" && h != claimant && h != said {
				log.Info("claim: held by the workload cluster's own hub; wanted back (a hub run with --fallback hands it back at its next safe checkpoint, one without never does)",
					"lease", lease.String(), "holder", h)
				said = h
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// nodeOfMachine is the Node of inventory machine name (the fallback's name for it), and the reverse.
func nodeOfMachine(inv pass.Inventory, name string) string {
	if m, ok := inv.Machine(name); ok && m.Node != "" {
		return m.Node
	}
	return name
}

func machineOfNode(inv pass.Inventory, node string) string {
	for _, m := range inv.Machines {
		if m.Node == node {
			return m.Name
		}
	}
	return node
}

// cellPinned are a cell's pinned keys: its workload cluster's (the ConfigMap the agents there read
// and enrol into), the management hub's own key among them.
type cellPinned struct {
	pk   enrol.PinnedKeys
	keys identity.Pinned
	text string // the ConfigMap's text keys were read from
	said string // the last error said
}

// pin pins the hub's key in the workload cluster's pinned keys, by which the agents there verify the
// cell's reports, and returns them. It makes the ConfigMap when the agents' install has not.
func (r *Runner) pin(ctx context.Context, pk enrol.PinnedKeys, cluster client.ObjectKey) (*cellPinned, error) {
	err := pk.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: pk.Key.Namespace, Name: pk.Key.Name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("the pinned keys in the workload cluster of Cluster API Cluster %s (ConfigMap %s: are Hale's agents installed there?): %w", cluster, pk.Key, err)
	}
	p := &cellPinned{pk: pk}
	if err := p.pinSelf(ctx, r); err != nil {
		return nil, fmt.Errorf("the workload cluster of Cluster API Cluster %s: %w", cluster, err)
	}
	return p, nil
}

// pinSelf pins the hub's key (as r.PinAs) unless it is pinned already, and reads the pinned keys.
func (p *cellPinned) pinSelf(ctx context.Context, r *Runner) error {
	keys, text, err := p.pk.Pinned(ctx)
	if err == nil && !slices.ContainsFunc(keys.Keys(r.Node), func(k identity.PublicKey) bool { return k.String() == r.Identity.Public().String() }) {
		if _, err = p.pk.Pin(ctx, r.PinAs, r.Identity.Public()); err == nil {
			keys, text, err = p.pk.Pinned(ctx)
		}
	}
	if err == nil {
		p.keys, p.text = keys, text
	}
	return err
}

// refresh hands g the workload cluster's pinned keys when they changed (pinning the hub's key again
// if it was taken out by hand); when they cannot be read, the last ones stay.
func (p *cellPinned) refresh(ctx context.Context, g *health.Gossip, r *Runner, log *slog.Logger) {
	last := p.text
	switch err := p.pinSelf(ctx, r); {
	case err != nil && ctx.Err() == nil && err.Error() != p.said:
		log.Warn("pinned keys: cannot read them from the workload cluster; the last ones stay", "err", err)
		p.said = err.Error()
	case err == nil && p.text != last:
		g.SetPinned(p.keys)
		p.said = ""
		log.Info("pinned keys: read from the workload cluster", "configMap", p.pk.Key.String(), "entries", p.keys.Len())
	}
}
