package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/degraded"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube"
	"github.com/hale-dev/hale/kube/ask"
	"github.com/hale-dev/hale/kube/claim"
	"github.com/hale-dev/hale/kube/outofservice"
)

// kubeOptions are `hub run`'s Kubernetes mode: the journal in Remediation objects, one leader among
// the replicas (a Lease), the pause and suspend of a HealthPolicy and of a Cluster API Cluster.
type kubeOptions struct {
	kubeconfig    string
	config        *rest.Config // tests set it; else from kubeconfig, or in-cluster
	namespace     string
	lease         string
	policy        string
	capiCluster   string
	leaseDuration time.Duration
	// discover: the inventory from the cluster (kube.Discovery), every discoverEvery.
	discover         bool
	machineNamespace string
	discoverEvery    time.Duration
	// agentPort: with discover, the agents' gossip port at each control-plane and witness Node's
	// address, joined at start.
	agentPort int
	// degradedJournal, when set, turns degraded mode on (degraded.go): the local journal of a term
	// without the API server; breakGlass is the inventory of the BMCs it may use then.
	degradedJournal, breakGlass string
	// enrol: members enrol their identity keys through the API server (enrol.Enroller); agents and
	// hubs are the service accounts (in namespace) whose requests pin a node's key, or a replica's.
	enrol        bool
	agents, hubs []string
	// management: management mode (management.go); gossipService, the Service whose one endpoint the
	// leading replica makes itself (cells.LeaderEndpoint).
	management    bool
	gossipService string
	// fallback: this hub is its workload cluster's fallback (kube/claim): while it leads, it hands the
	// Lease back at its next safe checkpoint to the management cluster's cell that wants it.
	fallback bool
}

// kubeClient is a client with Hale's, Cluster API's and the built-in types.
func (k *kubeOptions) kubeClient() (client.Client, *rest.Config, error) {
	cfg, err := k.restConfig()
	if err != nil {
		return nil, nil, err
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, clusterv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, nil, err
		}
	}
	c, err := client.New(k.clientConfig(cfg), client.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, cfg, nil
}

// clientConfig is the hub's client's configuration of cfg.
func (k *kubeOptions) clientConfig(cfg *rest.Config) *rest.Config {
	// Each request ends after a fifth of the lease (3 s by default, 2 s at least; 10 s without one): the API server
	// of a cluster whose etcd just lost quorum accepts a write and never answers, and a pass held that
	// long by its journal write keeps the hub's view from before the loss, which is what decides, when
	// the Lease runs out, whether the leader goes on alone (degraded mode). A sequential loss (cp-0,
	// then cp-1 seconds later) on the real cluster left the leader standing by that way.
	cc := rest.CopyConfig(cfg)
	cc.Timeout = 10 * time.Second
	if k.leaseDuration > 0 {
		cc.Timeout = max(k.leaseDuration/5, 2*time.Second)
	}
	if k.management {
		// One client serves every cell, and client-go gives each kind of object a limiter of its own,
		// 5 requests a second (burst 10), when the configuration sets none. Each cell reads its
		// HealthPolicy, its Cluster, its Machines, Remediations and HaleRemediations every second: past
		// five cells every cell's requests of a kind queued behind the others', its journal writes
		// included (at 200 cells, some 40 s behind). The management cluster's API server limits the
		// hub instead, by its priority and fairness.
		cc.QPS = -1
	}
	return cc
}

func (k *kubeOptions) restConfig() (*rest.Config, error) {
	if k.config != nil {
		return k.config, nil
	}
	quickHTTP2HealthCheck()
	cfg, err := clientcmd.BuildConfigFromFlags("", k.kubeconfig) // "" → in-cluster
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %q: %w", k.kubeconfig, err)
	}
	return cfg, nil
}

// quickHTTP2HealthCheck makes client-go drop a connection to an API server that has sent nothing for
// 2 s and then left a ping unanswered for 2 s, unless the operator set these variables. client-go's
// defaults are 30 s and 15 s: the hub reaches the API servers through the kubernetes Service, one
// HTTP/2 connection carries every request, and when the control-plane machine behind it hangs (its
// TCP still accepts, nothing answers) the Lease's renewals wait on it past the renew deadline, so
// every hang of one control-plane machine cost the leader its Lease (a 15 s takeover, and no hub
// acting meanwhile).
func quickHTTP2HealthCheck() {
	for _, v := range []string{"HTTP2_READ_IDLE_TIMEOUT_SECONDS", "HTTP2_PING_TIMEOUT_SECONDS"} {
		if _, set := os.LookupEnv(v); !set {
			_ = os.Setenv(v, "2")
		}
	}
}

// kubeClient is Kubernetes mode's client of the API server, and its configuration.
type kubeClient struct {
	c   client.Client
	cfg *rest.Config
}

// standbyAnswer is what a replica that does not lead answers an operator: which replica holds the
// Lease ns/name, and its pod (a replica given no --node is named hub-POD-RANDOM: runHub), to ask instead.
func standbyAnswer(ctx context.Context, c client.Client, ns, name string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var lease coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &lease); err != nil {
		return fmt.Sprintf("this hub replica stands by: the Lease %s/%s names the one that leads, and cannot be read now (%v): ask the other replica", ns, name, err)
	}
	holder := kube.LeaseHolder(&lease)
	if holder == "" {
		return fmt.Sprintf("this hub replica stands by: no replica leads right now (the Lease %s/%s has no holder): ask again in a few seconds", ns, name)
	}
	if node, cluster, ok := strings.Cut(holder, "@"); ok { // a management cell's claim (kube/cellhub)
		return fmt.Sprintf("this hub stands by: the management cluster's hub %s heals this cluster (as Cluster API Cluster %s) and holds the claim, the Lease %s/%s; "+
			"this hub acts only once that hub stops renewing it, and with --fallback hands it back when that hub returns: ask it (hub status --cluster %s)", node, cluster, ns, name, cluster)
	}
	answer := fmt.Sprintf("this hub replica stands by: %s holds the Lease %s/%s", holder, ns, name)
	if pod := holderPod(holder); pod != "" {
		answer += fmt.Sprintf("; ask its pod: kubectl -n %s exec %s -- hub …", ns, pod)
	}
	return answer
}

// holderPod is the pod of a Lease holder named hub-POD-RANDOM (run.go's default name), or "".
func holderPod(holder string) string {
	rest, ok := strings.CutPrefix(holder, "hub-")
	i := strings.LastIndexByte(rest, '-')
	if !ok || i < 1 || len(rest)-i-1 != nodeSuffix {
		return ""
	}
	return rest[:i]
}

// leaseTiming is the leader election's timing for --lease-duration d: renewals given up after two
// thirds of it (client-go's default ratio, 10 s of 15), tried every tenth. A leader that loses its
// Lease to a lost quorum decides whether to act alone (kube.Degraded.AfterLoss) between losing it
// (client-go: the renew deadline plus a retry period after the last renewal, 0.77 of d) and the end
// of its authority (0.95 of d): 2.75 s at 15 s. With three quarters (0.85) that was 1.5 s, which a
// loaded node missed: the decision came 1.8 s after the loss, 14.55 s after the renewal, and two of
// three hung control-plane nodes were left unhealed (a full test run, the real kubeadm cluster).
func leaseTiming(d time.Duration) kube.LeaseTiming {
	return kube.LeaseTiming{LeaseDuration: d, RenewDeadline: d * 2 / 3, RetryPeriod: d / 10}
}

// importPatience is how long a new leader tries to import its pod's degraded journal before it gives
// the Lease up (kube.ImportDegradedWhileLeading).
const importPatience = 5 * time.Minute

// runLeading campaigns for the Lease until ctx ends; while this replica leads, a hub journals to
// Remediation objects at the lease's epoch, fenced by the lease, and follows the HealthPolicy.
func runLeading(ctx context.Context, o runOptions, kc kubeClient, log *slog.Logger, inventory *inventory.Reloader,
	newHub func(journal.Store, func(*hub.Config)) (*hub.Hub, error), current *atomic.Pointer[term]) error {
	k, c, cfg := o.kube, kc.c, kc.cfg
	var capi *client.ObjectKey
	if k.capiCluster != "" && k.capiCluster != "auto" {
		ns, name, ok := strings.Cut(k.capiCluster, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("--capi-cluster %q: want NAMESPACE/NAME", k.capiCluster)
		}
		capi = &client.ObjectKey{Namespace: ns, Name: name}
	}
	breakGlass, err := checkDegradedFlags(k)
	if err != nil {
		return err
	}
	dg := &kube.Degraded{Journal: k.degradedJournal, History: o.keep, BreakGlass: breakGlass, BreakGlassPath: k.breakGlass,
		Namespace: k.namespace, Lease: k.lease, LeaseDuration: k.leaseDuration, Client: c, NewHub: newHub,
		Stopped: func() { current.Store(nil) }, Log: log}
	identity := o.node
	if k.degradedJournal != "" {
		t, err := degraded.ReadTerm(k.degradedJournal)
		if err != nil {
			return err
		}
		if t != nil { // a hub of this pod left a degraded term: this one is its continuation
			identity = t.Identity
			dg.Resume(ctx, *t, inventory.Current())
		}
	} else {
		log.Info("degraded mode is off (no --degraded-journal): with etcd's quorum lost this hub stops with the API server")
	}
	timing := leaseTiming(k.leaseDuration)
	log.Info("campaigning", "lease", k.namespace+"/"+k.lease, "identity", identity, "leaseDuration", k.leaseDuration)
	var last atomic.Pointer[hub.Hub] // the hub of the latest term, for degraded mode's decision
	// What an import said that no hub has said yet: a term that imported and then stopped before its
	// hub ran (a discovery failure gives the Lease up) leaves them to this process's next term (the
	// local journal is gone: the next import says nothing). Terms run one after another.
	var unsaid []pass.Notice
	// unwritten: notices said whose Events a term ended before writing; the next term writes them.
	var unwritten []pass.Notice
	lost := func(ctx context.Context, leader *kube.Leader, renewed time.Time, stopped <-chan struct{}) {
		dg.AfterLoss(ctx, leader, renewed, last.Swap(nil), stopped)
	}
	return kube.Elect(ctx, cfg, c, k.namespace, k.lease, identity, timing, func(lctx context.Context, leader *kube.Leader) {
		log.Info("leading", "lease", k.namespace+"/"+k.lease, "epoch", leader.Epoch())
		defer current.Store(nil)
		if k.enrol {
			go k.enroller(c, log).Run(lctx, nil)
		}
		var brakes hub.BrakeStore
		var recoveries hub.RecoveryStore
		var policy client.ObjectKey
		if k.policy != "" {
			// The operator's brakes (pause, suspend, detached machines) live in the HealthPolicy: the
			// socket's commands and kubectl write the same fields, and a new leader finds them there. So
			// do the last etcd recovery (the members it retired stay held until they rejoin) and the raft
			// mark (a cluster rebuilt while another replica led is found by its ID).
			policy = client.ObjectKey{Namespace: k.namespace, Name: k.policy}
			brakes, recoveries = kube.PolicyBrakes{Client: c, Policy: policy}, kube.PolicyRecoveries{Client: c, Policy: policy}
		}
		journal := kube.NewJournal(c, k.namespace, leader.Epoch(), o.keep).WithFence(leader.Check)
		// A degraded term's local journal is imported first, before anything that may fail and give the
		// Lease up: it is on this pod's disk only, and another replica leading first knows nothing of the
		// term (an etcd recovery it carried out looks like a rebuild outside Hale; its fences are
		// unknown, so no out-of-service taint).
		if k.degradedJournal != "" {
			imported, ok := kube.ImportDegradedWhileLeading(lctx, k.degradedJournal, journal, brakes, recoveries, timing.RetryPeriod, importPatience, log)
			if !ok {
				return
			}
			unsaid = append(unsaid, imported...)
		}
		var adjust func(*hub.Config)
		var d *kube.Discovery
		if k.discover {
			d = &kube.Discovery{Client: c, Base: inventory.Current(), Namespace: k.machineNamespace, Log: log}
			inv, err := d.Build(lctx)
			if err != nil {
				log.Error("discovering the inventory", "err", err)
				return
			}
			sink := kube.NewEventSink(c, d, o.node, log)
			if k.policy != "" {
				sink.Hub = corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HealthPolicy", Namespace: k.namespace, Name: k.policy}
			}
			// It stops with the term (also one that stops while leading: lctx goes on until the
			// Lease is given up), and what it did not write goes to the next.
			sctx, stop := context.WithCancel(lctx)
			written := make(chan []pass.Notice, 1)
			go func() { written <- sink.Run(sctx) }()
			defer func() {
				stop()
				unwritten = append(unwritten, <-written...)
			}()
			sink.Carry(unwritten)
			unwritten = nil
			adjust = func(cfg *hub.Config) {
				cfg.Inventory = inv
				cfg.PowerFor = d.PowerFor(cfg.BMCPower)
				cfg.OwnerFor = d.OwnerFor
				cfg.Notify = sink.Notify
			}
			log.Info("discovered", "machines", len(inv.Machines))
		}
		if k.policy != "" {
			discovered := adjust
			adjust = func(cfg *hub.Config) {
				if discovered != nil {
					discovered(cfg)
				}
				cfg.Brakes, cfg.Recoveries, cfg.Marks = brakes, recoveries, kube.PolicyMarks{Client: c, Policy: policy}
				cfg.Episodes = kube.PolicyEpisodes{Client: c, Policy: policy}
			}
		}
		// A machine Hale fenced and its BMC reads Off gets the out-of-service taint on its Node
		// (policy.outOfServiceAfter): the leader's only, never a degraded term's (no API server).
		before := adjust
		adjust = func(cfg *hub.Config) {
			if before != nil {
				before(cfg)
			}
			cfg.OutOfService = outofservice.Taints{Client: c}
		}
		h, err := newHub(journal, adjust)
		if err != nil {
			log.Error("starting the hub", "err", err)
			return
		}
		h.Say(unsaid...)
		unsaid = nil
		last.Store(h)
		requests := &kube.RequestSync{Client: c, Namespace: k.namespace, Hub: h, Epoch: leader.Epoch(), Log: log,
			Machines: k.discover, MachineNamespace: k.machineNamespace}
		go requests.Run(lctx)
		if d != nil {
			d.Healthy = kube.HealthyIn(h)
			go d.Run(lctx, k.discoverEvery, func(inv pass.Inventory) error {
				d.Base = inventory.Current()
				return h.SetInventory(inv)
			}, log)
		}
		if k.policy != "" {
			sync := &kube.PolicySync{Client: c, Policy: policy, Cluster: capi, FindCluster: k.capiCluster == "auto",
				MachineNamespace: k.machineNamespace, Hub: h, Log: log}
			go sync.Run(lctx)
		}
		hctx := lctx
		if k.fallback {
			var handBack context.CancelFunc
			hctx, handBack = context.WithCancel(lctx)
			defer handBack()
			b := &claim.HandBack{Client: c, Lease: client.ObjectKey{Namespace: k.namespace, Name: k.lease}, Hub: h,
				Every: timing.RetryPeriod, Fresh: timing.LeaseDuration, Log: log}
			go func() {
				if b.Run(hctx) {
					handBack() // the term ends: the Lease is given up, and the cell takes it
				}
			}()
		}
		if err := h.Run(hctx); err != nil {
			log.Error("hub", "err", err)
		}
		log.Info("no longer leading", "epoch", leader.Epoch())
	}, lost)
}

// rebootThroughKubernetes is `hub reboot --kubernetes`: a Remediation request, so that RBAC decides;
// it waits until the leading hub has accepted or refused it (and with wait, until it has ended), and
// returns the object as it last read it (none when it read none).
func rebootThroughKubernetes(ctx context.Context, k *kubeOptions, req operator.RebootRequest, wait bool, out io.Writer) (v1alpha1.Remediation, error) {
	var obj v1alpha1.Remediation
	c, _, err := k.kubeClient()
	if err != nil {
		return obj, &codedError{exitUsage, err}
	}
	key, err := ask.Reboot(ctx, c, k.namespace, req.Machine, req.Hard, req.Force, req.By)
	if apierrors.IsForbidden(err) {
		return obj, &codedError{exitRefused, fmt.Errorf("%w (Kubernetes RBAC: you may not create Remediations in %s)", err, k.namespace)}
	} else if err != nil {
		return obj, &codedError{exitUnreachable, err}
	}
	fmt.Fprintf(out, "requested: remediation %s\n", key)
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	obj, err = ask.Wait(tctx, c, key, false)
	cancel()
	if err != nil {
		return obj, &codedError{exitUnreachable, err}
	}
	if obj.Status.Phase == v1alpha1.PhaseAborted {
		return obj, &codedError{exitRefused, errors.New(lastDetail(obj))} // "refused: …"
	}
	fmt.Fprintf(out, "accepted by the hub (epoch %d): %s\n", obj.Status.Epoch, strings.Join(obj.Spec.Steps, " → "))
	if !wait {
		return obj, nil
	}
	if obj, err = ask.Wait(ctx, c, key, true); err != nil {
		return obj, &codedError{exitUnreachable, err}
	}
	fmt.Fprintln(out, lastDetail(obj)) // "Succeeded: every step done"
	if obj.Status.Phase != v1alpha1.PhaseSucceeded {
		return obj, &codedError{exitRefused, fmt.Errorf("remediation %s %s", key, obj.Status.Phase)}
	}
	return obj, nil
}

func lastDetail(obj v1alpha1.Remediation) string {
	if n := len(obj.Status.History); n > 0 {
		return obj.Status.History[n-1].Detail
	}
	return ""
}

// joinPeers lists the agents to join: --join's, and with --discover the agents at the control-plane
// and witness Nodes' addresses (read again at each try). Nil: none.
func joinPeers(ctx context.Context, o runOptions, log *slog.Logger) func() []string {
	if o.kube == nil || !o.kube.discover {
		if len(o.join) == 0 {
			return nil
		}
		return func() []string { return o.join }
	}
	c, _, err := o.kube.kubeClient()
	return func() []string {
		peers := slices.Clone(o.join)
		if err != nil {
			log.Warn("finding the agents at the Nodes' addresses", "err", err)
			return peers
		}
		nodes, lerr := kube.NodePeers(ctx, c, o.kube.agentPort)
		if lerr != nil {
			log.Warn("finding the agents at the Nodes' addresses", "err", lerr)
		}
		return append(peers, nodes...)
	}
}
