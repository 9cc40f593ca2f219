package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/kube/clusterapi"
)

// External remediation: a health checker hands its unhealthy machines to Hale by making a
// HaleRemediation from a HaleRemediationTemplate, and deletes it once the machine is healthy again.
// Two checkers do so, each its own way:
//   - Cluster API's MachineHealthCheck (spec.remediation.templateRef): named after the Machine, in its
//     namespace, owned by the Machine;
//   - medik8s' NodeHealthCheck (spec.remediationTemplate, escalatingRemediations): named after the Node
//     (or annotated remediation.medik8s.io/node-name), in the template's namespace, owned by the
//     NodeHealthCheck; it reads the conditions Processing, Succeeded and PermanentNodeDeletionExpected.
// Hale carries each out as `hub reboot` would, the machine's own way (through its BMC, or handed to
// its owner), through the same quorum check, brakes and journal; never around them.

// HaleRemediationTemplateKind is what a MachineHealthCheck's templateRef names to hand its Machines to
// Hale.
const HaleRemediationTemplateKind = "HaleRemediationTemplate"

// Conditions on a HaleRemediation (the names medik8s' remediators use and NodeHealthCheck reads).
const (
	ConditionProcessing                    = "Processing"
	ConditionSucceeded                     = "Succeeded"
	ConditionPermanentNodeDeletionExpected = "PermanentNodeDeletionExpected"
)

// NodeNameAnnotation names the Node a NodeHealthCheck's request is about when its name does not.
const NodeNameAnnotation = "remediation.medik8s.io/node-name"

// external is what a HaleRemediation asks for: the inventory machine, who asked (for the journal), and
// whether a NodeHealthCheck did (medik8s' contract: no owner to hand a machine to).
type external struct {
	machine, by     string
	nodeHealthCheck bool
}

// externalOf reads whose request r is and which machine it is about, or says why Hale takes it not.
func (s *RequestSync) externalOf(r *v1alpha1.HaleRemediation) (external, string) {
	key := client.ObjectKeyFromObject(r)
	for _, o := range r.OwnerReferences {
		group, _, _ := strings.Cut(o.APIVersion, "/")
		switch {
		case group == clusterv1.GroupVersion.Group && o.Kind == "Machine" && o.Name == r.Name:
			return external{machine: r.Name, by: "MachineHealthCheck (HaleRemediation " + key.String() + ")"}, ""
		case group == "remediation.medik8s.io" && o.Kind == "NodeHealthCheck":
			node := cmp.Or(r.Annotations[NodeNameAnnotation], r.Name)
			m, ok := s.Hub.Inventory().MachineOfNode(node)
			if !ok {
				return external{}, fmt.Sprintf("Node %s is none of Hale's machines (`hub status` lists them)", node)
			}
			return external{machine: m.Name, by: "NodeHealthCheck " + o.Name + " (HaleRemediation " + key.String() + ")", nodeHealthCheck: true}, ""
		}
	}
	return external{}, fmt.Sprintf("neither owned by Machine %s (a MachineHealthCheck's request) nor by a NodeHealthCheck: Hale takes no other", r.Name)
}

// delegatesToHale says whether the MachineHealthCheck hands its remediations to Hale.
func delegatesToHale(mhc *clusterv1.MachineHealthCheck) bool {
	ref := mhc.Spec.Remediation.TemplateRef
	return ref.Kind == HaleRemediationTemplateKind && ref.APIVersion == v1alpha1.GroupVersion.String()
}

// syncExternal carries out the HaleRemediations in MachineNamespace once: a request not yet taken is
// asked of the hub (refused: it waits, status.message says why, and is asked again); one taken is
// followed to its end; one that failed hands its Machine to its owner.
func (s *RequestSync) syncExternal(ctx context.Context) error {
	var list v1alpha1.HaleRemediationList
	err := s.lists().List(ctx, &list, client.InNamespace(s.MachineNamespace))
	if meta.IsNoMatchError(err) || apierrors.IsForbidden(err) {
		return nil // no HaleRemediation CRD here, or not Hale's to read
	} else if err != nil {
		return fmt.Errorf("listing HaleRemediations: %w", err)
	}
	var errs []error
	for i := range list.Items {
		r := &list.Items[i]
		if r.DeletionTimestamp != nil || (s.Cluster != "" && r.Labels[clusterv1.ClusterNameLabel] != s.Cluster) {
			continue // another cell's (a MachineHealthCheck labels its requests with their Cluster)
		}
		switch r.Status.Phase {
		case "", v1alpha1.ExternalWaiting, v1alpha1.ExternalRunning:
			if ok, err := s.fresh(ctx, r); err != nil || !ok || r.DeletionTimestamp != nil {
				errs = append(errs, err) // deleted since the list was made (nil)
				continue
			}
		}
		switch r.Status.Phase {
		case "", v1alpha1.ExternalWaiting:
			errs = append(errs, s.takeExternal(ctx, r))
		case v1alpha1.ExternalRunning:
			errs = append(errs, s.followExternal(ctx, r))
		}
	}
	return errors.Join(errs...)
}

// takeExternal asks the hub to remediate r's Machine.
func (s *RequestSync) takeExternal(ctx context.Context, r *v1alpha1.HaleRemediation) error {
	e, why := s.externalOf(r)
	if why != "" {
		return s.writeExternal(ctx, r, e, v1alpha1.ExternalWaiting, "", "waiting: "+why)
	}
	res, err := s.Hub.Reboot(ctx, operator.RebootRequest{Machine: e.machine, OwnWay: true, Hard: r.Spec.Hard, By: e.by})
	if err != nil {
		return s.writeExternal(ctx, r, e, v1alpha1.ExternalWaiting, "", "waiting: "+err.Error())
	}
	s.Log.Info("external remediation taken", "request", client.ObjectKeyFromObject(r), "by", e.by, "remediation", res.Remediation, "steps", res.Steps)
	return s.writeExternal(ctx, r, e, v1alpha1.ExternalRunning, res.Remediation, fmt.Sprintf("remediation %s under way: %v", res.Remediation, res.Steps))
}

// followExternal reads the remediation r's request started and, once it ended, says how. One that ended
// before it acted is asked again; a failed one hands the Machine to its owner (its OwnerRemediated
// condition False), as the contract asks of an external remediator that cannot heal the machine,
// unless Hale sees the machine Healthy (the owner would take away a member etcd counts); while Hale
// sees it Suspect, the request stays Running and the choice waits for the verdict.
func (s *RequestSync) followExternal(ctx context.Context, r *v1alpha1.HaleRemediation) error {
	e, why := s.externalOf(r)
	if why != "" { // its machine left the inventory meanwhile
		return s.writeExternal(ctx, r, e, v1alpha1.ExternalFailed, r.Status.Remediation, why)
	}
	hist, err := s.Hub.History(ctx, e.machine)
	if err != nil {
		return fmt.Errorf("reading the remediations of %s for HaleRemediation %s/%s: %w", e.machine, r.Namespace, r.Name, err)
	}
	i := slices.IndexFunc(hist, func(h journal.Remediation) bool { return h.ID == r.Status.Remediation })
	if i < 0 {
		return s.writeExternal(ctx, r, e, v1alpha1.ExternalFailed, r.Status.Remediation, fmt.Sprintf("remediation %s is no longer in the journal (deleted, or pruned): "+
			"its outcome is unknown", r.Status.Remediation))
	}
	rem, last := hist[i], ""
	if n := len(rem.History); n > 0 {
		last = rem.History[n-1].Detail
	}
	switch rem.State {
	case journal.Succeeded:
		return s.writeExternal(ctx, r, e, v1alpha1.ExternalSucceeded, rem.ID, fmt.Sprintf("remediation %s succeeded: %s", rem.ID, last))
	case journal.Aborted:
		// Ended before it acted (the check before its step refused it, or its request was withdrawn):
		// nothing was done, so nothing is handed on; the request is asked again.
		return s.writeExternal(ctx, r, e, v1alpha1.ExternalWaiting, "", fmt.Sprintf("waiting: remediation %s ended before it acted (%s); asked again", rem.ID, last))
	case journal.Failed:
		why := fmt.Sprintf("remediation %s failed: %s", rem.ID, last)
		if e.nodeHealthCheck { // Succeeded False: the NodeHealthCheck may go on to its next remediator
			return s.writeExternal(ctx, r, e, v1alpha1.ExternalFailed, rem.ID, why)
		}
		switch a, ok := s.Hub.Assessment(e.machine); {
		case ok && a.Verdict == assess.VerdictHealthy:
			// Handed over, its owner would take away a machine Hale sees healthy (a member etcd counts).
			return s.writeExternal(ctx, r, e, v1alpha1.ExternalFailed, rem.ID, why+"; not handed to its owner: Hale sees "+e.machine+" Healthy")
		case ok && a.Verdict == assess.VerdictSuspect:
			// Undecided (a load spike, a report late): the owner's replacement waits for a verdict,
			// and the request stays Running so that the next sync asks again.
			return s.writeExternal(ctx, r, e, v1alpha1.ExternalRunning, rem.ID, why+"; Hale sees "+e.machine+
				" Suspect: the Machine is handed to its owner only once Hale sees it Unhealthy (and not if it is Healthy again)")
		}
		machine := client.ObjectKey{Namespace: r.Namespace, Name: r.Name}
		if err := clusterapi.HandOverToOwner(ctx, s.Client, machine, "HaleRemediation "+r.Name+": "+why); err != nil {
			return s.writeExternal(ctx, r, e, v1alpha1.ExternalFailed, rem.ID, why+"; handing the Machine to its owner failed: "+err.Error())
		}
		return s.writeExternal(ctx, r, e, v1alpha1.ExternalFailed, rem.ID, why+"; the Machine is handed to its owner (OwnerRemediated False)")
	}
	return nil
}

// writeExternal writes r's status when it changes.
func (s *RequestSync) writeExternal(ctx context.Context, r *v1alpha1.HaleRemediation, e external, phase v1alpha1.ExternalPhase, remediation, message string) error {
	if r.Status.Phase == phase && r.Status.Remediation == remediation && r.Status.Message == message {
		return nil
	}
	r.Status.Phase, r.Status.Remediation, r.Status.Message = phase, remediation, message
	processing, succeeded := metav1.ConditionTrue, metav1.ConditionUnknown
	switch phase {
	case v1alpha1.ExternalSucceeded:
		processing, succeeded = metav1.ConditionFalse, metav1.ConditionTrue
	case v1alpha1.ExternalFailed:
		processing, succeeded = metav1.ConditionFalse, metav1.ConditionFalse
	}
	meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{Type: ConditionProcessing, Status: processing, Reason: string(phase), Message: message,
		ObservedGeneration: r.Generation})
	meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{Type: ConditionSucceeded, Status: succeeded, Reason: string(phase), Message: message,
		ObservedGeneration: r.Generation})
	if e.nodeHealthCheck {
		meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{Type: ConditionPermanentNodeDeletionExpected, Status: metav1.ConditionFalse,
			Reason: "NotDeleted", Message: "Hale never deletes the Node", ObservedGeneration: r.Generation})
	}
	if err := s.Client.Status().Update(ctx, r); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing the status of HaleRemediation %s/%s: %w", r.Namespace, r.Name, err)
	}
	return nil
}
