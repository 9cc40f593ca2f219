package kube

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/hub/recoveryplan"
	"github.com/hale-dev/hale/quorum"
)

// PolicySync keeps a HealthPolicy and the hub in step, level-triggered: spec.paused (or a paused
// Cluster API Cluster) and spec.suspended are applied to the hub, and the hub's acknowledgement
// (status.pause: Running, Pausing until the steps in flight reach a checkpoint, then Paused), budget
// and verdicts are written back to status.
type PolicySync struct {
	Client client.Client
	Policy client.ObjectKey
	// Cluster, when set, is the Cluster API Cluster this hub heals: its pause (spec.paused or the
	// cluster.x-k8s.io/paused annotation) pauses Hale too, with the same acknowledgement.
	Cluster *client.ObjectKey
	// FindCluster (Cluster unset): the Cluster is the one whose Machines the control-plane Nodes are
	// (ClusterOfControlPlane, Machines in MachineNamespace; "": all), looked for until found.
	FindCluster      bool
	MachineNamespace string
	Hub              *hub.Hub
	// Cache, when set, is where each sync reads the policy and the Cluster (a management-mode hub's
	// lists.Shared: one watch of each kind for every cell, not two reads a cell each second); what
	// the hub wrote itself is read no older than that write. nil: Client.
	Cache Cache
	// Interval between syncs (default 1 s).
	Interval time.Duration
	Log      *slog.Logger
}

// Cache is an informer cache of the API server whose reads are no older than this process's own
// writes, each recorded with Wrote (kube/lists).
type Cache interface {
	Lister
	Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error
	Wrote(obj client.Object)
}

// wrote records obj, just written, with cache (when there is one).
func wrote(cache Cache, obj client.Object) {
	if cache != nil {
		cache.Wrote(obj)
	}
}

// Run syncs every Interval until ctx ends; a failed sync is logged and retried.
func (s *PolicySync) Run(ctx context.Context) {
	interval := s.Interval
	if interval <= 0 {
		interval = time.Second
	}
	log := s.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	last := ""
	for {
		err := s.Sync(ctx)
		switch {
		case err != nil && ctx.Err() == nil && err.Error() != last: // said once, not every second
			log.Warn("syncing the health policy; retrying", "policy", s.Policy, "err", err)
			last = err.Error()
		case err == nil:
			last = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sync applies the policy's brakes to the hub once and writes the hub's state to the policy's status.
func (s *PolicySync) Sync(ctx context.Context) error {
	var p v1alpha1.HealthPolicy
	// Taken before the read: a brake the hub changes meanwhile (over its socket) wins over this read.
	seq := s.Hub.BrakeSeq()
	read := s.Client.Get
	if s.Cache != nil {
		read = s.Cache.Get
	}
	err := read(ctx, s.Policy, &p)
	if apierrors.IsNotFound(err) {
		// Made here rather than shipped in deploy/: a HealthPolicy applied with its CRD in one
		// `kubectl apply -k` fails (the kind is not known yet).
		p = v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: s.Policy.Namespace, Name: s.Policy.Name}}
		if err := s.Client.Create(ctx, &p); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating HealthPolicy %s (none found): %w", s.Policy, err)
		}
		err = s.Client.Get(ctx, s.Policy, &p)
	}
	if err != nil {
		return fmt.Errorf("reading HealthPolicy %s: %w", s.Policy, err)
	}
	// The operator's brakes live in the policy (kubectl and `hub pause` alike write them there); a
	// paused Cluster API Cluster is a pause of its own. Any pause holds.
	s.Hub.ApplyBrakes(seq, brakesOf(&p))
	// The policy's fields replace the inventory's where set; a bad one keeps what is in force.
	override, policyErr := overrideOf(p.Spec)
	if policyErr == nil {
		s.Hub.SetPolicyOverride(override)
	}
	if s.Cluster == nil && s.FindCluster {
		found, err := ClusterOfControlPlane(ctx, s.Client, s.MachineNamespace)
		if err != nil {
			return err
		}
		if found != nil {
			s.Cluster = found
			if s.Log != nil {
				s.Log.Info("following the Cluster API Cluster of the control-plane Machines: its pause pauses Hale", "cluster", *found)
			}
		}
	}
	if s.Cluster != nil {
		var c clusterv1.Cluster
		if err := read(ctx, *s.Cluster, &c); err != nil {
			return fmt.Errorf("reading Cluster %s: %w", *s.Cluster, err)
		}
		if err := s.holdCluster(ctx, &c, brakesOf(&p).Paused); err != nil {
			return err
		}
		_, annotated := c.Annotations[clusterv1.PausedAnnotation]
		_, ours := c.Annotations[ClusterPausedForAnnotation]
		// Hale's own pause of the Cluster is no pause of Hale's: the recovery's pause holds it already.
		s.Hub.SetPause(fmt.Sprintf("Cluster API Cluster %s", *s.Cluster), (c.Spec.Paused != nil && *c.Spec.Paused) || annotated && !ours,
			"spec.paused or the "+clusterv1.PausedAnnotation+" annotation")
	}

	st := s.Hub.Status(ctx)
	before := p.DeepCopy()
	p.Status.Pause = string(st.Pause)
	p.Status.ObservedGeneration = p.Generation
	p.Status.Budget = nil
	if b := st.Budget; b != nil {
		p.Status.Budget = &v1alpha1.Budget{Voters: int32(b.Voters), HealthyVoters: int32(b.HealthyVoters), Quorum: int32(b.Quorum),
			FaultTolerance: int32(b.FaultTolerance), Available: int32(b.Available)}
	}
	p.Status.Machines = nil
	for _, m := range st.Machines {
		ms := v1alpha1.MachineSummary{Name: m.Name, Verdict: string(m.Verdict), Reasons: m.Reasons}
		if m.Remediation != nil {
			ms.Remediation = m.Remediation.ID
		}
		p.Status.Machines = append(p.Status.Machines, ms)
	}
	cond := metav1.Condition{Type: "Paused", Status: metav1.ConditionFalse, Reason: "Running", Message: "remediations may start",
		ObservedGeneration: p.Generation}
	if len(st.PausedBy) > 0 {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "HealthPolicy", fmt.Sprintf("%s; paused by %s", st.Pause, hub.DescribeBrakes(st.PausedBy))
		if !p.Spec.Paused {
			cond.Reason = "ClusterPaused"
		}
	}
	meta.SetStatusCondition(&p.Status.Conditions, cond)
	applied := metav1.Condition{Type: "PolicyApplied", Status: metav1.ConditionTrue, Reason: "Applied", ObservedGeneration: p.Generation,
		Message: "in force: " + st.Policy.String()}
	if len(st.Policy.Overridden) == 0 {
		applied.Message += " (all from the inventory: this HealthPolicy sets none of its policy fields)"
	}
	if policyErr != nil {
		applied.Status, applied.Reason = metav1.ConditionFalse, "Invalid"
		applied.Message = fmt.Sprintf("%v: the policy in force stays: %s", policyErr, st.Policy)
	}
	meta.SetStatusCondition(&p.Status.Conditions, applied)
	if equality.Semantic.DeepEqual(before.Status, p.Status) {
		return nil
	}
	if err := s.Client.Status().Patch(ctx, &p, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("writing the status of HealthPolicy %s: %w", s.Policy, err)
	}
	wrote(s.Cache, &p)
	return nil
}

// ClusterPausedForAnnotation marks the Cluster API Cluster's pause as Hale's, for the etcd recovery it
// names: Hale lifts only a pause it set.
const ClusterPausedForAnnotation = "hale.dev/paused-for"

// holdCluster pauses the Cluster API Cluster (its paused annotation, marked as Hale's) while an etcd
// recovery pauses Hale, and lifts that pause once the recovery's is lifted (`hub resume`). Meanwhile
// KubeadmControlPlane and the MachineHealthChecks leave the machines alone while their members are
// rebuilt and rejoined; afterwards they replace, as usual, those that did not come back. A Cluster
// paused by someone else is left as it is.
func (s *PolicySync) holdCluster(ctx context.Context, c *clusterv1.Cluster, pause *pass.Brake) error {
	token, recovering := recoveryplan.PauseToken(pause)
	_, annotated := c.Annotations[clusterv1.PausedAnnotation]
	pausedFor, ours := c.Annotations[ClusterPausedForAnnotation]
	var set map[string]any
	switch {
	case recovering && !annotated:
		set = map[string]any{clusterv1.PausedAnnotation: "", ClusterPausedForAnnotation: "etcd recovery " + token}
	case !recovering && ours:
		set = map[string]any{clusterv1.PausedAnnotation: nil, ClusterPausedForAnnotation: nil}
	default:
		return nil
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": set}})
	if err != nil {
		return err
	}
	if err := s.Client.Patch(ctx, c, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("pausing or resuming Cluster %s for etcd recovery %s: %w", *s.Cluster, token, err)
	}
	wrote(s.Cache, c)
	if s.Log != nil {
		msg := "Cluster API Cluster paused: an etcd recovery pauses Hale"
		if !recovering {
			msg = "Cluster API Cluster resumed: the etcd recovery's pause was lifted"
		}
		s.Log.Info(msg, "cluster", *s.Cluster, "for", cmp.Or(pausedFor, "etcd recovery "+token))
	}
	return nil
}

// overrideOf reads a HealthPolicy's policy fields (those set) as an override of the inventory's
// policy; an error names the field.
func overrideOf(spec v1alpha1.HealthPolicySpec) (inventory.PolicyOverride, error) {
	var o inventory.PolicyOverride
	if v := spec.MinFaultTolerance; v != nil {
		if *v < 0 {
			return o, fmt.Errorf("spec.minFaultTolerance: %d must not be negative", *v)
		}
		n := int(*v)
		o.MinFaultTolerance = &n
	}
	for _, l := range []struct {
		field, value string
		dst          **quorum.Limit
	}{{"spec.maxInFlight", spec.MaxInFlight, &o.MaxInFlight}, {"spec.maxUnhealthy", spec.MaxUnhealthy, &o.MaxUnhealthy}} {
		v, ok, err := inventory.CheckLimit(l.field, l.value)
		if err != nil {
			return o, err
		}
		if ok {
			*l.dst = &v
		}
	}
	for probe, d := range spec.ProbeTimeouts {
		if o.ProbeTimeouts == nil {
			o.ProbeTimeouts = map[string]time.Duration{}
		}
		o.ProbeTimeouts[probe] = d.Duration
	}
	if err := inventory.CheckProbeTimeouts("spec.probeTimeouts", o.ProbeTimeouts); err != nil {
		return o, err
	}
	if spec.Cooldown != nil {
		if err := inventory.CheckWait("spec.cooldown", spec.Cooldown.Duration, ""); err != nil {
			return o, err
		}
		d := spec.Cooldown.Duration
		o.Cooldown = &d
	}
	if spec.MaxAttempts != 0 {
		if spec.MaxAttempts < 0 {
			return o, fmt.Errorf("spec.maxAttempts: %d must be at least 1", spec.MaxAttempts)
		}
		n := int(spec.MaxAttempts)
		o.MaxAttempts = &n
	}
	for _, w := range []struct {
		field string
		spec  *v1alpha1.QuorumWaits
		dst   *inventory.PerQuorumOverride
	}{{"spec.stallTolerance", spec.StallTolerance, &o.StallTolerance}, {"spec.componentGrace", spec.ComponentGrace, &o.ComponentGrace}} {
		if w.spec == nil {
			continue
		}
		for _, v := range []struct {
			name string
			d    *metav1.Duration
			dst  **time.Duration
		}{{"quorumHeld", w.spec.QuorumHeld, &w.dst.Held}, {"quorumNeeded", w.spec.QuorumNeeded, &w.dst.Needed}} {
			if v.d == nil {
				continue
			}
			if err := inventory.CheckWait(w.field+"."+v.name, v.d.Duration, "at once"); err != nil {
				return o, err
			}
			d := v.d.Duration
			*v.dst = &d
		}
	}
	return o, nil
}

// ClusterOfControlPlane is the Cluster API Cluster whose Machines (in namespace; "": all) are this
// cluster's control-plane Nodes (by status.nodeRef): nil when no Machine is (not a Cluster API
// cluster, or its Machines not linked yet), an error naming them when they belong to several.
func ClusterOfControlPlane(ctx context.Context, c client.Client, namespace string) (*client.ObjectKey, error) {
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes, client.HasLabels{ControlPlaneLabel}); err != nil {
		return nil, fmt.Errorf("listing control-plane nodes: %w", err)
	}
	controlPlane := map[string]bool{}
	for _, n := range nodes.Items {
		controlPlane[n.Name] = true
	}
	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing Cluster API Machines: %w", err)
	}
	found := map[client.ObjectKey]bool{}
	for _, m := range machines.Items {
		if controlPlane[m.Status.NodeRef.Name] && m.Spec.ClusterName != "" {
			found[client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.ClusterName}] = true
		}
	}
	keys := slices.SortedFunc(maps.Keys(found), func(a, b client.ObjectKey) int { return strings.Compare(a.String(), b.String()) })
	switch len(keys) {
	case 0:
		return nil, nil
	case 1:
		return &keys[0], nil
	}
	return nil, fmt.Errorf("the control-plane nodes are Machines of %d Cluster API Clusters (%v): name the one Hale heals with --capi-cluster NAMESPACE/NAME", len(keys), keys)
}
