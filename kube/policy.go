package kube

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub"
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
	Hub     *hub.Hub
	// Interval between syncs (default 1 s).
	Interval time.Duration
	Log      *slog.Logger
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
	err := s.Client.Get(ctx, s.Policy, &p)
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
	paused, reason, message := p.Spec.Paused, "HealthPolicy", fmt.Sprintf("spec.paused of HealthPolicy %s", s.Policy)
	if s.Cluster != nil && !paused {
		var c clusterv1.Cluster
		if err := s.Client.Get(ctx, *s.Cluster, &c); err != nil {
			return fmt.Errorf("reading Cluster %s: %w", *s.Cluster, err)
		}
		_, annotated := c.Annotations[clusterv1.PausedAnnotation]
		if (c.Spec.Paused != nil && *c.Spec.Paused) || annotated {
			paused, reason, message = true, "ClusterPaused", fmt.Sprintf("Cluster API Cluster %s is paused", *s.Cluster)
		}
	}
	s.Hub.SetPaused(paused)
	s.Hub.SetSuspended(p.Spec.Suspended)

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
	if paused {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, reason, message+": "+string(st.Pause)
	}
	meta.SetStatusCondition(&p.Status.Conditions, cond)
	if equality.Semantic.DeepEqual(before.Status, p.Status) {
		return nil
	}
	if err := s.Client.Status().Patch(ctx, &p, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("writing the status of HealthPolicy %s: %w", s.Policy, err)
	}
	return nil
}
