package kube

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube/clusterapi"
)

// verdicts is a Rebooter whose one remediation failed and whose verdict on its machine the test sets.
type verdicts struct{ verdict assess.Verdict }

func (v *verdicts) Reboot(context.Context, operator.RebootRequest) (operator.RebootResult, error) {
	return operator.RebootResult{}, nil
}
func (v *verdicts) Assessment(m string) (assess.Assessment, bool) {
	return assess.Assessment{Machine: m, Verdict: v.verdict}, true
}
func (v *verdicts) Inventory() pass.Inventory { return pass.Inventory{} }
func (v *verdicts) History(_ context.Context, m string) ([]journal.Remediation, error) {
	return []journal.Remediation{{ID: "r-1", Machine: m, State: journal.Failed,
		History: []journal.Entry{{Detail: "cycle: could not verify"}}}}, nil
}

// A MachineHealthCheck's request whose power-cycle failed is handed to the Machine's owner (which
// deletes it, and so its etcd member) only on Hale's verdict Unhealthy: on Healthy it is not, and on
// Suspect (undecided: a loaded moment) it stays Running until the verdict settles.
func TestFailedExternalRemediationWaitsForAVerdict(t *testing.T) {
	for _, tc := range []struct {
		name     string
		verdicts []assess.Verdict
		phase    v1alpha1.ExternalPhase
		message  string
		handed   bool
	}{
		{"healthy", []assess.Verdict{assess.VerdictHealthy}, v1alpha1.ExternalFailed, "not handed to its owner: Hale sees cp-0 Healthy", false},
		{"unhealthy", []assess.Verdict{assess.VerdictUnhealthy}, v1alpha1.ExternalFailed, "the Machine is handed to its owner", true},
		{"suspect", []assess.Verdict{assess.VerdictSuspect}, v1alpha1.ExternalRunning, "Hale sees cp-0 Suspect: the Machine is handed to its owner only once", false},
		{"suspect, then healthy", []assess.Verdict{assess.VerdictSuspect, assess.VerdictHealthy}, v1alpha1.ExternalFailed, "not handed to its owner", false},
		{"suspect, then unhealthy", []assess.Verdict{assess.VerdictSuspect, assess.VerdictUnhealthy}, v1alpha1.ExternalFailed, "the Machine is handed to its owner", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, ns := shared.Namespace(t)
			ctx := t.Context()
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cp-0"},
				Spec: clusterv1.MachineSpec{ClusterName: "prod", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr("bootstrap")},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Machine", Name: "cp-0"}}}
			require.NoError(t, c.Create(ctx, m))
			r := &v1alpha1.HaleRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cp-0",
				OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: "cp-0", UID: m.UID}}},
				Spec: v1alpha1.HaleRemediationSpec{Hard: true}}
			require.NoError(t, c.Create(ctx, r))
			r.Status = v1alpha1.HaleRemediationStatus{Phase: v1alpha1.ExternalRunning, Remediation: "r-1", Message: "under way"}
			require.NoError(t, c.Status().Update(ctx, r))

			hub := &verdicts{}
			s := &RequestSync{Client: c, Namespace: ns, Hub: hub, Epoch: 1, MachineNamespace: ns, Interval: time.Second, Log: slog.New(slog.DiscardHandler)}
			for _, v := range tc.verdicts {
				hub.verdict = v
				require.NoError(t, s.syncExternal(ctx))
			}
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(r), r))
			assert.Equal(t, tc.phase, r.Status.Phase)
			assert.Contains(t, r.Status.Message, tc.message)
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(m), m))
			assert.Equal(t, tc.handed, clusterapi.HandedOver(m))
		})
	}
}
