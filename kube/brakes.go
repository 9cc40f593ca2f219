package kube

// The operator's brakes (pause, observe-only, detach), kept in the HealthPolicy.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/pass"
)

// Annotations on the HealthPolicy recording who set spec.paused and spec.suspended, and why (a
// hub.Brake as JSON). Without one (kubectl patch), the policy itself is named.
const (
	PausedByAnnotation    = "hale.dev/paused-by"
	SuspendedByAnnotation = "hale.dev/suspended-by"
)

// PolicyBrakes keeps the operator's brakes in a HealthPolicy: spec.paused and spec.suspended (who and
// why in annotations), spec.detached. `hub pause`, `hub detach` … over a replica's socket write there,
// as kubectl does, so there is one source of truth, and a new leader finds the brakes where the last
// one left them.
type PolicyBrakes struct {
	Client client.Client
	Policy client.ObjectKey
	// Cache, when set, is told of each write (PolicySync reads the brakes back from it: a read that
	// has not seen this write would take the brake back).
	Cache Cache
}

// LoadBrakes reads the brakes (none when there is no policy yet).
func (pb PolicyBrakes) LoadBrakes(ctx context.Context) (pass.Brakes, error) {
	var p v1alpha1.HealthPolicy
	err := pb.Client.Get(ctx, pb.Policy, &p)
	switch {
	case apierrors.IsNotFound(err):
		return pass.Brakes{}, nil
	case err != nil:
		return pass.Brakes{}, fmt.Errorf("reading HealthPolicy %s: %w", pb.Policy, err)
	}
	return brakesOf(&p), nil
}

// SaveBrakes writes the brakes to the policy (creating it when missing).
func (pb PolicyBrakes) SaveBrakes(ctx context.Context, b pass.Brakes) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var p v1alpha1.HealthPolicy
		err := pb.Client.Get(ctx, pb.Policy, &p)
		create := apierrors.IsNotFound(err)
		switch {
		case create:
			p = v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: pb.Policy.Namespace, Name: pb.Policy.Name}}
		case err != nil:
			return fmt.Errorf("reading HealthPolicy %s: %w", pb.Policy, err)
		}
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		for _, f := range []struct {
			brake      *pass.Brake
			spec       *bool
			annotation string
		}{{b.Paused, &p.Spec.Paused, PausedByAnnotation}, {b.Suspended, &p.Spec.Suspended, SuspendedByAnnotation}} {
			*f.spec = f.brake != nil
			delete(p.Annotations, f.annotation)
			if f.brake != nil {
				v, _ := json.Marshal(f.brake)
				p.Annotations[f.annotation] = string(v)
			}
		}
		p.Spec.Detached = nil
		for _, m := range slices.Sorted(maps.Keys(b.Detached)) {
			d := b.Detached[m]
			since := metav1.NewTime(d.Since)
			p.Spec.Detached = append(p.Spec.Detached, v1alpha1.DetachedMachine{Name: m, By: d.By, Reason: d.Reason, Since: &since})
		}
		if create {
			err = pb.Client.Create(ctx, &p)
		} else {
			err = pb.Client.Update(ctx, &p)
		}
		if err != nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("writing the brakes to HealthPolicy %s: %w", pb.Policy, err)
		}
		if apierrors.IsAlreadyExists(err) { // made meanwhile (the sync makes it too): read it and go again
			return apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("healthpolicies").GroupResource(), pb.Policy.Name, err)
		}
		if err == nil {
			wrote(pb.Cache, &p)
		}
		return err
	})
}

// brakesOf reads the operator's brakes from a policy.
func brakesOf(p *v1alpha1.HealthPolicy) pass.Brakes {
	var b pass.Brakes
	who := func(annotation, field string) *pass.Brake {
		var br pass.Brake
		if v, ok := p.Annotations[annotation]; ok && json.Unmarshal([]byte(v), &br) == nil && br.By != "" {
			return &br
		}
		return &pass.Brake{By: fmt.Sprintf("HealthPolicy %s/%s spec.%s", p.Namespace, p.Name, field)}
	}
	if p.Spec.Paused {
		b.Paused = who(PausedByAnnotation, "paused")
	}
	if p.Spec.Suspended {
		b.Suspended = who(SuspendedByAnnotation, "suspended")
	}
	for _, d := range p.Spec.Detached {
		if b.Detached == nil {
			b.Detached = map[string]pass.Brake{}
		}
		br := pass.Brake{By: cmp.Or(d.By, fmt.Sprintf("HealthPolicy %s/%s spec.detached", p.Namespace, p.Name)), Reason: d.Reason}
		if d.Since != nil {
			br.Since = d.Since.Time
		}
		b.Detached[d.Name] = br
	}
	return b
}
