// Package ask is the asking side of a reboot request made in Kubernetes (`hub reboot --kubernetes`):
// a Remediation without status, which the leading hub's kube.RequestSync takes or refuses.
package ask

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/kube"
	"github.com/hale-dev/hale/quorum"
)

// Reboot creates a reboot request for machine in ns (what `hub reboot --kubernetes` does);
// the leading hub's kube.RequestSync carries it out. Kubernetes RBAC decides whether the caller may.
func Reboot(ctx context.Context, c client.Client, ns, machine string, hard, force bool, by string) (client.ObjectKey, error) {
	obj := &v1alpha1.Remediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "reboot-" + kube.DNSSafe(machine) + "-"},
		Spec: v1alpha1.RemediationSpec{Machine: machine, Strategy: quorum.Reboot.String(), RequestedBy: by, Reason: "manual reboot", Hard: hard, Force: force}}
	if err := c.Create(ctx, obj); err != nil {
		return client.ObjectKey{}, fmt.Errorf("creating a reboot request in %s: %w", ns, err)
	}
	return client.ObjectKeyFromObject(obj), nil
}

// Wait waits until the hub has taken the request (accepted: InProgress; refused: Aborted)
// or, with done, until it has ended; it returns the object as last read.
func Wait(ctx context.Context, c client.Client, key client.ObjectKey, done bool) (v1alpha1.Remediation, error) {
	for {
		var obj v1alpha1.Remediation
		if err := c.Get(ctx, key, &obj); err != nil {
			return obj, fmt.Errorf("reading remediation %s: %w", key, err)
		}
		switch p := obj.Status.Phase; {
		case p != "" && p != v1alpha1.PhaseInProgress, p == v1alpha1.PhaseInProgress && !done:
			return obj, nil
		}
		select {
		case <-ctx.Done():
			return obj, fmt.Errorf("waiting for the hub to take remediation %s (is a hub leading in %s?): %w", key, key.Namespace, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
