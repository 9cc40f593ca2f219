package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/quorum"
)

// RecoveryAnnotation on the HealthPolicy holds the last etcd recovery (a hub.RecoveryRecord as JSON).
const RecoveryAnnotation = "hale.dev/etcd-recovery"

// PolicyRecoveries keeps the last etcd recovery in the HealthPolicy (RecoveryAnnotation), where every
// leader finds it: the old cluster's members it retired stay held until they rejoin (hub/retired.go),
// also after the degraded term that carried the recovery out has been imported and its local journal
// removed.
type PolicyRecoveries struct {
	Client client.Client
	Policy client.ObjectKey
}

// Recovery reads the last recovery (nil: none, or no policy yet).
func (pr PolicyRecoveries) Recovery(ctx context.Context) (*hub.RecoveryRecord, error) {
	var p v1alpha1.HealthPolicy
	err := pr.Client.Get(ctx, pr.Policy, &p)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading HealthPolicy %s: %w", pr.Policy, err)
	}
	v, ok := p.Annotations[RecoveryAnnotation]
	if !ok {
		return nil, nil
	}
	var r hub.RecoveryRecord
	if err := json.Unmarshal([]byte(v), &r); err != nil {
		return nil, fmt.Errorf("HealthPolicy %s: annotation %s: %w (it is Hale's record of the last etcd recovery: restore it, or remove it to forget that recovery)",
			pr.Policy, RecoveryAnnotation, err)
	}
	return &r, nil
}

// RecordRecovery writes r as the last recovery (creating the policy when missing).
func (pr PolicyRecoveries) RecordRecovery(ctx context.Context, r hub.RecoveryRecord) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{RecoveryAnnotation: string(v)}}})
	if err != nil {
		return err
	}
	p := &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: pr.Policy.Namespace, Name: pr.Policy.Name}}
	err = pr.Client.Patch(ctx, p, client.RawPatch(types.MergePatchType, patch))
	if apierrors.IsNotFound(err) {
		p.Annotations = map[string]string{RecoveryAnnotation: string(v)}
		if err = pr.Client.Create(ctx, p); apierrors.IsAlreadyExists(err) { // made meanwhile
			err = pr.Client.Patch(ctx, p, client.RawPatch(types.MergePatchType, patch))
		}
	}
	if err != nil {
		return fmt.Errorf("recording etcd recovery %s in HealthPolicy %s: %w", r.Plan.Token, pr.Policy, err)
	}
	return nil
}

// ImportRecovery writes back a recovery that a degraded term journaled locally while the API server
// did not answer: the record into store (the HealthPolicy), a Remediation per fenced member (strategy
// fence, its fence as its history; note says where it was recorded), and Events (notify): one per
// fenced machine and one for the recovery. Imported again (an import cut short), nothing is written
// twice.
func ImportRecovery(ctx context.Context, j *Journal, store hub.RecoveryStore, rec hub.RecoveryRecord, note string, notify func(hub.Notice)) error {
	if store != nil {
		if err := store.RecordRecovery(ctx, rec); err != nil {
			return err
		}
	}
	p := rec.Plan
	var fenced []string
	for _, f := range p.Fence {
		if f.Machine == "" {
			continue
		}
		state := hub.Succeeded
		if !f.Fenced {
			state = hub.Aborted
		}
		r := hub.Remediation{Machine: f.Machine, Strategy: quorum.Fence.String(), RequestedBy: rec.By, State: state, Attempt: 1,
			Reason:  fmt.Sprintf("etcd recovery %s: %s lost for good, fenced before etcd was rebuilt from %s", p.Token, f.Member, survivorOf(p)),
			Steps:   []quorum.Step{{Op: quorum.OpPowerOff, Member: f.Member}},
			Created: rec.Began, Updated: rec.Began,
			History: []hub.Entry{{At: rec.Began, Step: 0, Kind: hub.EntryOutcome, Result: hub.ResultDone, Detail: f.How}}}
		if !f.Fenced {
			r.History[0].Result, r.History[0].Detail = hub.ResultFailed, "not fenced when the term ended: "+f.How
		}
		fresh, err := j.Import(ctx, r, note)
		if err != nil {
			return fmt.Errorf("importing the fence of %s by etcd recovery %s: %w", f.Machine, p.Token, err)
		}
		fenced = append(fenced, fmt.Sprintf("%s (%s)", f.Machine, f.Member))
		if fresh && notify != nil {
			notify(hub.Notice{Machine: f.Machine, Reason: hub.ReasonEtcdRecovery, Warning: true,
				Message: fmt.Sprintf("%s: fenced by etcd recovery %s (%s): %s", f.Machine, p.Token, state, f.How)})
		}
	}
	if notify != nil {
		done := "under way: the survivor had not yet answered as a new cluster"
		if rec.Done != nil {
			done = "done: etcd cluster " + rec.NewClusterID
		}
		notify(hub.Notice{Reason: hub.ReasonEtcdRecovery, Warning: true,
			Message: fmt.Sprintf("etcd recovery %s by %s, begun %s while the API server did not answer: rebuilt from %s, fenced %s; %s",
				p.Token, rec.By, rec.Began.UTC().Format("2006-01-02T15:04:05Z"), survivorOf(p), strings.Join(fenced, ", "), done)})
	}
	return nil
}

func survivorOf(p hub.RecoveryPlan) string {
	if s := p.Survivor; s != nil {
		return fmt.Sprintf("%s (%s)", s.Member, s.Machine)
	}
	return "its survivor"
}
