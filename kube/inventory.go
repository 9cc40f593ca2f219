package kube

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/hale-dev/hale/quorum"
)

const (
	// ControlPlaneLabel marks the nodes Hale watches (kubeadm sets it).
	ControlPlaneLabel = "node-role.kubernetes.io/control-plane"
	// EtcdMemberAnnotation on a Node names its etcd member when it is not the node's name (kubeadm's
	// stacked etcd names each member after its node); an empty value says the node runs no member.
	EtcdMemberAnnotation = "hale.dev/etcd-member"
	// ControlPlanePool is the pool of the control-plane machines that are not etcd members.
	ControlPlanePool = "control-plane"
	// WitnessLabel marks the nodes that run a witness agent (the witness DaemonSet's nodeSelector):
	// each one is an expected observer.
	WitnessLabel = "hale.dev/witness"
)

// Discovery builds the hub's inventory from the cluster: every control-plane Node, the Cluster API
// Machine behind it and its owner, and the metal3 BareMetalHost behind that. What each machine is
// healed with follows from what exists:
//
//  1. a BareMetalHost: its baremetal-operator owns the BMC, so Hale reboots and fences through the
//     host's reboot annotation (clusterapi.Metal3Host); a detached or paused host is held, with the reason;
//  2. a machine of Base's inventory with the same node: its BMC, called directly (standalone BMC mode);
//  3. a Cluster API owner (KubeadmControlPlane, MachineSet): replaced by the owner, handed over with
//     the MachineHealthCheck contract once the quorum plan allows the owner's steps (delete first:
//     see clusterapi.MachineOwner);
//  4. nothing: watched and explained, held ("no way to heal it").
//
// A Machine annotated cluster.x-k8s.io/skip-remediation is held whatever its way.
type Discovery struct {
	// Client reads and writes Cluster API's and metal3's objects (and, without Workload, the Nodes);
	// Lists, when set, serves Build's lists of them (a management-mode hub's shared cache).
	Client client.Client
	Lists  Lister
	// Workload, when set, is the workload cluster's API, for a hub in a management cluster: the Nodes
	// and NodeMaintenances are read there, Cluster API's and metal3's objects through Client.
	Workload client.Client
	// ClusterName, when set, is the Cluster API Cluster whose machines these are: Machines and
	// MachineHealthChecks of other Clusters are left out (a management cluster holds many clusters'
	// machines, and their node names may be the same), and a BareMetalHost is found only through a
	// Machine's infrastructure, never by a node's name.
	ClusterName string
	// Base gives the gossip cluster name, the policy, and the machines whose BMC Hale calls itself.
	Base pass.Inventory
	// Namespace, when set, is where Cluster API Machines and BareMetalHosts are looked for (default:
	// every namespace).
	Namespace string
	// MetalPoll and MetalTimeout: how a BareMetalHost's power state is awaited (defaults 1 s, 10 min).
	MetalPoll, MetalTimeout time.Duration
	// Healthy, when set, says whether the hub sees a machine healthy (its member included): a
	// MachineDeployment's surge waits for it before the old machine goes.
	Healthy func(machine string) bool

	// Log, when set, is told once of each kind Hale may not read (RBAC): machines of that kind are
	// then found without it.
	Log *slog.Logger

	mu    sync.Mutex
	bound map[string]binding
	// departed are the bindings of machines that left the inventory (an owner deleted the Machine
	// it replaced), kept for departedFor: the hub still closes their remediations, and its Events
	// about them regard the object they were about.
	departed map[string]departedBinding
	warned   map[string]bool
}

// departedFor is how long a departed machine's binding is kept.
const departedFor = time.Hour

type departedBinding struct {
	binding
	since time.Time
}

// binding is what Discovery found behind one inventory machine.
type binding struct {
	node       string
	machine    *client.ObjectKey // the Cluster API Machine
	owner      *ownerRef
	deployment *client.ObjectKey // the MachineDeployment over the owning MachineSet
	host       *client.ObjectKey // the BareMetalHost
}

type ownerRef struct {
	apiVersion, kind, name string
}

// Build reads the cluster once and returns the inventory; the previous one stays with the caller
// when it fails.
func (d *Discovery) Build(ctx context.Context) (pass.Inventory, error) {
	var nodes corev1.NodeList
	if err := d.nodes().List(ctx, &nodes, client.HasLabels{ControlPlaneLabel}); err != nil {
		return pass.Inventory{}, fmt.Errorf("listing control-plane nodes%s: %w", d.inWorkload(), err)
	}
	lists := listerOr(d.Lists, d.Client)
	var machines clusterv1.MachineList
	if err := d.optional(lists.List(ctx, &machines, client.InNamespace(d.Namespace)), "Cluster API Machines", "deploy/components/capi"); err != nil {
		return pass.Inventory{}, err
	}
	machines.Items = slices.DeleteFunc(machines.Items, func(m clusterv1.Machine) bool { return !d.ours(m.Spec.ClusterName) })
	var checks clusterv1.MachineHealthCheckList
	if err := d.optional(lists.List(ctx, &checks, client.InNamespace(d.Namespace)), "Cluster API MachineHealthChecks", "deploy/components/capi"); err != nil {
		return pass.Inventory{}, err
	}
	checks.Items = slices.DeleteFunc(checks.Items, func(c clusterv1.MachineHealthCheck) bool { return !d.ours(c.Spec.ClusterName) })
	hosts := &unstructured.UnstructuredList{}
	hosts.SetGroupVersionKind(clusterapi.BareMetalHostGVK.GroupVersion().WithKind(clusterapi.BareMetalHostGVK.Kind + "List"))
	if err := d.optional(lists.List(ctx, hosts, client.InNamespace(d.Namespace)), "metal3 BareMetalHosts", "deploy/components/metal3"); err != nil {
		return pass.Inventory{}, err
	}
	work, err := d.newPlannedWork(ctx)
	if err != nil {
		return pass.Inventory{}, err
	}
	byNode := map[string]*clusterv1.Machine{}
	for i := range machines.Items {
		if n := machines.Items[i].Status.NodeRef.Name; n != "" {
			byNode[n] = &machines.Items[i]
		}
	}
	var witnessNodes corev1.NodeList
	if err := d.nodes().List(ctx, &witnessNodes, client.HasLabels{WitnessLabel}); err != nil {
		return pass.Inventory{}, fmt.Errorf("listing witness nodes (label %s)%s: %w", WitnessLabel, d.inWorkload(), err)
	}
	inv := pass.Inventory{Cluster: d.Base.Cluster, Policy: d.Base.Policy, Witnesses: slices.Clone(d.Base.Witnesses)}
	for _, n := range witnessNodes.Items {
		if _, cp := n.Labels[ControlPlaneLabel]; !cp && !slices.Contains(inv.Witnesses, n.Name) {
			inv.Witnesses = append(inv.Witnesses, n.Name)
		}
	}
	slices.Sort(inv.Witnesses)
	bound := map[string]binding{}
	slices.SortFunc(nodes.Items, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	for _, n := range nodes.Items {
		m := pass.Machine{MachineRef: assess.MachineRef{Name: n.Name, Node: n.Name, Member: n.Name}, Class: "kubernetes", Pool: ControlPlanePool, Strategy: quorum.Reboot}
		member, annotated := n.Annotations[EtcdMemberAnnotation]
		if annotated {
			m.Member = member
		}
		for _, c := range n.Status.Conditions {
			m.Conditions = append(m.Conditions, assess.NodeCondition{Type: string(c.Type), Status: string(c.Status), Reason: c.Reason, Since: c.LastTransitionTime.Time})
		}
		b := binding{node: n.Name}
		cm := byNode[n.Name]
		if cm != nil {
			m.Name = cm.Name
			b.machine = &client.ObjectKey{Namespace: cm.Namespace, Name: cm.Name}
			for _, ref := range cm.OwnerReferences {
				if ref.Controller != nil && *ref.Controller {
					b.owner = &ownerRef{apiVersion: ref.APIVersion, kind: ref.Kind, name: ref.Name}
				}
			}
		}
		host := findHost(hosts.Items, cm, n.Name, d.ClusterName == "")
		base, inBase := baseMachine(d.Base, n.Name)
		switch {
		case host != nil:
			b.host = &client.ObjectKey{Namespace: host.GetNamespace(), Name: host.GetName()}
			m.Hold = clusterapi.HostHold(host)
		case inBase:
			m.Strategy, m.Class, m.Pool = base.Strategy, base.Class, cmp.Or(base.Pool, ControlPlanePool)
			// Its BMC, as the file gives it: the hub checks it, reads the power back after a fence and
			// fences it to recover etcd, as it does in standalone mode.
			m.Endpoint, m.Credentials, m.CAFile, m.Insecure = base.Endpoint, base.Credentials, base.CAFile, base.Insecure
			if !annotated { // the file names the member; the Node's annotation, when there, wins
				m.Member = base.Member
			}
		case b.owner != nil:
			m.Strategy = quorum.Replace
			m.Replace = quorum.ReplaceOptions{Orders: []quorum.Order{quorum.ScaleDownFirst}, Join: quorum.JoinAsVoter}
			if b.deployment = d.deploymentOf(ctx, cm.Namespace, b.owner); b.deployment != nil {
				// A MachineDeployment can surge: scale up first where the plan allows it.
				m.Replace.Orders = []quorum.Order{quorum.ScaleUpFirst, quorum.ScaleDownFirst}
			}
			if mhc := healthCheckOf(checks.Items, cm); mhc != nil && !delegatesToHale(mhc) {
				m.Hold = fmt.Sprintf("Machine %s/%s is remediated by MachineHealthCheck %s/%s, which rewrites the conditions Hale "+
					"would hand it over with: Hale watches it and leaves its remediation to that MachineHealthCheck (take the "+
					"Machine out of its selector, or delete it, to let Hale heal it with its quorum checks)", cm.Namespace, cm.Name, mhc.Namespace, mhc.Name)
			}
		default:
			m.Hold = "no way to heal it: no BareMetalHost, no BMC in the inventory file, no Cluster API owner"
		}
		if cm != nil {
			if mhc := healthCheckOf(checks.Items, cm); mhc != nil && delegatesToHale(mhc) {
				m.CheckedBy = fmt.Sprintf("Machine %s/%s is judged by MachineHealthCheck %s/%s, which hands its remediations to Hale (HaleRemediationTemplate %s): "+
					"Hale carries out its requests (HaleRemediations) and starts none of its own", cm.Namespace, cm.Name, mhc.Namespace, mhc.Name, mhc.Spec.Remediation.TemplateRef.Name)
			}
			if _, skip := cm.Annotations[clusterv1.MachineSkipRemediationAnnotation]; skip {
				m.Hold = fmt.Sprintf("Machine %s/%s is annotated %s", cm.Namespace, cm.Name, clusterv1.MachineSkipRemediationAnnotation)
			}
		}
		m.PlannedWork = work.of(ctx, &n, cm, b)
		inv.Machines = append(inv.Machines, m)
		bound[m.Name] = b
	}
	d.mu.Lock()
	now := time.Now()
	if d.departed == nil {
		d.departed = map[string]departedBinding{}
	}
	for name, b := range d.bound {
		if _, still := bound[name]; !still {
			d.departed[name] = departedBinding{b, now}
		}
	}
	for name, b := range d.departed {
		if _, back := bound[name]; back || now.Sub(b.since) > departedFor {
			delete(d.departed, name)
		}
	}
	d.bound = bound
	d.mu.Unlock()
	return inv, nil
}

// NodePeers are the gossip addresses of the agents on the control-plane and witness Nodes: each
// Node's InternalIP at port (the agents' DaemonSets use the host network, one port for all).
func NodePeers(ctx context.Context, c client.Client, port int) ([]string, error) {
	var peers []string
	for _, label := range []string{ControlPlaneLabel, WitnessLabel} {
		var nodes corev1.NodeList
		if err := c.List(ctx, &nodes, client.HasLabels{label}); err != nil {
			return peers, fmt.Errorf("listing the Nodes labelled %s: %w", label, err)
		}
		for _, n := range nodes.Items {
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					if p := net.JoinHostPort(a.Address, strconv.Itoa(port)); !slices.Contains(peers, p) {
						peers = append(peers, p)
					}
				}
			}
		}
	}
	return peers, nil
}

// healthCheckOf returns the MachineHealthCheck that selects the Machine, if one does: same cluster, its
// selector matching the Machine's labels (as the MachineHealthCheck controller selects).
func healthCheckOf(checks []clusterv1.MachineHealthCheck, m *clusterv1.Machine) *clusterv1.MachineHealthCheck {
	for i, mhc := range checks {
		if mhc.Spec.ClusterName != m.Spec.ClusterName || mhc.Namespace != m.Namespace {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&mhc.Spec.Selector)
		if err != nil || sel.Empty() {
			continue // the MachineHealthCheck controller selects nothing with these either
		}
		if sel.Matches(labels.Set(m.Labels)) {
			return &checks[i]
		}
	}
	return nil
}

// Run rebuilds the inventory every interval and hands it to set; a failed build keeps the previous
// inventory in force (logged).
func (d *Discovery) Run(ctx context.Context, interval time.Duration, set func(pass.Inventory) error, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		inv, err := d.Build(ctx)
		if err == nil {
			err = set(inv)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("discovering the inventory; keeping the previous one", "err", err)
		}
	}
}

// PowerFor is the hub's PowerFor in Kubernetes mode: the BareMetalHost's reboot annotation, or the
// machine's own BMC when the inventory file lists it.
func (d *Discovery) PowerFor(defaultPower func(pass.Machine) (execute.Power, error)) func(pass.Machine) (execute.Power, error) {
	return func(m pass.Machine) (execute.Power, error) {
		b, _ := d.binding(m.Name)
		switch {
		case b.host != nil:
			return &clusterapi.Metal3Host{Client: d.Client, Key: *b.host, Poll: d.MetalPoll, Timeout: d.MetalTimeout}, nil
		case m.Endpoint.Driver != "":
			return defaultPower(m)
		}
		return nil, fmt.Errorf("%s: no BareMetalHost and no BMC in the inventory file: nothing can power-cycle it", m.Name)
	}
}

// OwnerFor is the hub's OwnerFor in Kubernetes mode: the Cluster API Machine's owner.
func (d *Discovery) OwnerFor(m pass.Machine) (execute.Owner, error) {
	b, _ := d.binding(m.Name)
	if b.machine == nil || b.owner == nil {
		return nil, fmt.Errorf("%s: not a Cluster API Machine with an owner: nothing can replace it", m.Name)
	}
	owner := clusterapi.MachineOwner{Client: d.Client, Machine: *b.machine, OwnerAPIVersion: b.owner.apiVersion, OwnerKind: b.owner.kind, OwnerName: b.owner.name}
	if b.deployment != nil {
		return &clusterapi.DeploymentOwner{MachineOwner: owner, Deployment: *b.deployment, EtcdMember: m.Member != "", Healthy: d.Healthy}, nil
	}
	return &owner, nil
}

// deploymentOf is the MachineDeployment controlling a machine's MachineSet owner, or nil.
func (d *Discovery) deploymentOf(ctx context.Context, ns string, owner *ownerRef) *client.ObjectKey {
	if owner.kind != "MachineSet" {
		return nil
	}
	var ms clusterv1.MachineSet
	if err := d.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: owner.name}, &ms); err != nil {
		return nil
	}
	if ref := metav1.GetControllerOf(&ms); ref != nil && ref.Kind == "MachineDeployment" {
		return &client.ObjectKey{Namespace: ns, Name: ref.Name}
	}
	return nil
}

// binding is what was found behind machine name, in the inventory or departed from it lately.
func (d *Discovery) binding(name string) (binding, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b, ok := d.bound[name]; ok {
		return b, true
	}
	b, ok := d.departed[name]
	return b.binding, ok
}

// findHost is the BareMetalHost behind a machine: the one whose consumerRef is the Machine's
// infrastructure (a Metal3Machine), or, without Cluster API, the one named after the node (when
// byName: never in a management cluster, where hosts of other clusters may have that name).
func findHost(hosts []unstructured.Unstructured, m *clusterv1.Machine, node string, byName bool) *unstructured.Unstructured {
	for i, h := range hosts {
		if m != nil && h.GetNamespace() == m.Namespace {
			kind, _, _ := unstructured.NestedString(h.Object, "spec", "consumerRef", "kind")
			name, _, _ := unstructured.NestedString(h.Object, "spec", "consumerRef", "name")
			if ref := m.Spec.InfrastructureRef; ref.Name != "" && kind == ref.Kind && name == ref.Name {
				return &hosts[i]
			}
		}
	}
	for i, h := range hosts {
		if byName && h.GetName() == node {
			return &hosts[i]
		}
	}
	return nil
}

// nodes is the client of the cluster the Nodes are in: the workload cluster's, or Client's.
func (d *Discovery) nodes() client.Client {
	if d.Workload != nil {
		return d.Workload
	}
	return d.Client
}

// inWorkload names the workload cluster in an error about its Nodes, in a management cluster.
func (d *Discovery) inWorkload() string {
	if d.Workload == nil {
		return ""
	}
	return fmt.Sprintf(" in the workload cluster of Cluster API Cluster %s", client.ObjectKey{Namespace: d.Namespace, Name: d.ClusterName})
}

// ours: an object of Cluster API Cluster name is of the machines discovered (every one without ClusterName).
func (d *Discovery) ours(name string) bool { return d.ClusterName == "" || name == d.ClusterName }

func baseMachine(inv pass.Inventory, node string) (pass.Machine, bool) {
	for _, m := range inv.Machines {
		if m.Node == node {
			return m, true
		}
	}
	return pass.Machine{}, false
}

// optional: listing a kind Hale can do without. Not installed (no CRD): there are none. Forbidden
// (RBAC): none either, said once, naming the component that grants it. Anything else is an error.
func (d *Discovery) optional(err error, what, component string) error {
	switch {
	case err == nil || meta.IsNoMatchError(err):
		return nil
	case apierrors.IsForbidden(err):
		d.mu.Lock()
		first := !d.warned[what]
		if d.warned == nil {
			d.warned = map[string]bool{}
		}
		d.warned[what] = true
		d.mu.Unlock()
		if first && d.Log != nil {
			d.Log.Warn("may not list "+what+": machines are found without them (add "+component+" to let Hale use them)", "err", err)
		}
		return nil
	}
	return fmt.Errorf("listing %s: %w", what, err)
}

// HealthyIn says whether hub h sees a machine Healthy, its etcd member included (a MachineDeployment's
// surge waits for the new machine so: Discovery.Healthy).
func HealthyIn(h *hub.Hub) func(machine string) bool {
	return func(machine string) bool {
		a, ok := h.Assessment(machine)
		return ok && a.Verdict == assess.VerdictHealthy && a.EtcdHealth == quorum.Healthy
	}
}
