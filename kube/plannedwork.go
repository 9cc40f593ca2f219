package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub/inventory"
)

// NodeMaintenanceGVK is medik8s' NodeMaintenance (node-maintenance-operator): while one names a Node,
// its operator keeps the Node cordoned and drained.
var NodeMaintenanceGVK = schema.GroupVersionKind{Group: "nodemaintenance.medik8s.io", Version: "v1beta1", Kind: "NodeMaintenance"}

// plannedWork finds the planned work under way on the cluster's machines, for one Build: what the
// policy asks Discovery to honour, the NodeMaintenances read once, and each owner's rollout read once.
type plannedWork struct {
	d        *Discovery
	kinds    []string
	maint    map[string]string // Node → why
	rollouts map[string]string // a Machine's owner → why ("" when not rolling out)
}

func (d *Discovery) newPlannedWork(ctx context.Context) (*plannedWork, error) {
	w := &plannedWork{d: d, kinds: d.Base.Policy.PlannedWork, maint: map[string]string{}, rollouts: map[string]string{}}
	if !slices.Contains(w.kinds, inventory.WorkNodeMaintenance) {
		return w, nil
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(NodeMaintenanceGVK.GroupVersion().WithKind(NodeMaintenanceGVK.Kind + "List"))
	if err := d.optional(d.nodes().List(ctx, list), "medik8s NodeMaintenances", "deploy/base (the hub's ClusterRole)"); err != nil {
		return nil, err
	}
	for _, nm := range list.Items {
		node, _, _ := unstructured.NestedString(nm.Object, "spec", "nodeName")
		reason, _, _ := unstructured.NestedString(nm.Object, "spec", "reason")
		if node == "" {
			continue
		}
		why := fmt.Sprintf("NodeMaintenance %s puts Node %s in maintenance", nm.GetName(), node)
		if reason != "" {
			why += fmt.Sprintf(" (%s)", reason)
		}
		w.maint[node] = why + ": its operator drains it; Hale waits until it is deleted"
	}
	return w, nil
}

// of says what planned work is under way on the machine of Node n (its Cluster API Machine cm, nil
// when none; b what Build bound it to), the first in policy.plannedWork's order of kinds, or "".
func (w *plannedWork) of(ctx context.Context, n *corev1.Node, cm *clusterv1.Machine, b binding) string {
	for _, kind := range inventory.PlannedWorkKinds() {
		if !slices.Contains(w.kinds, kind) {
			continue
		}
		why := ""
		switch kind {
		case inventory.WorkCordoned:
			if n.Spec.Unschedulable {
				why = fmt.Sprintf("Node %s is cordoned (kubectl cordon or drain): planned work; `kubectl uncordon %s` when it is done", n.Name, n.Name)
			}
		case inventory.WorkDeleting:
			if cm != nil && cm.DeletionTimestamp != nil {
				why = fmt.Sprintf("Machine %s/%s is being deleted (since %s): its owner or an operator is taking it away", cm.Namespace, cm.Name,
					cm.DeletionTimestamp.UTC().Format("15:04:05Z07:00"))
			}
		case inventory.WorkRollout:
			if cm != nil {
				why = w.rollout(ctx, cm.Namespace, b)
			}
		case inventory.WorkNodeMaintenance:
			why = w.maint[n.Name]
		}
		if why != "" {
			return why + " (policy.plannedWork: " + kind + ")"
		}
	}
	return ""
}

// rollout says whether the owner that rolls the machine's changes out (its MachineSet's
// MachineDeployment, or its control plane: a KubeadmControlPlane) has its RollingOut condition True.
func (w *plannedWork) rollout(ctx context.Context, ns string, b binding) string {
	if b.owner == nil {
		return ""
	}
	gvk := schema.FromAPIVersionAndKind(b.owner.apiVersion, b.owner.kind)
	key := client.ObjectKey{Namespace: ns, Name: b.owner.name}
	owner := gvk.Kind + " " + key.String() // the Machine's own owner: one read of it (and its deployment) per Build
	if why, ok := w.rollouts[owner]; ok {
		return why
	}
	if b.owner.kind == "MachineSet" {
		md := b.deployment // Build found it for a machine its owner replaces
		if md == nil {
			md = w.d.deploymentOf(ctx, ns, b.owner)
		}
		if md == nil {
			w.rollouts[owner] = ""
			return ""
		}
		gvk, key = clusterv1.GroupVersion.WithKind("MachineDeployment"), *md
	}
	id := gvk.Kind + " " + key.String()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	why := ""
	err := w.d.Client.Get(ctx, key, u)
	if err != nil && !apierrors.IsNotFound(err) {
		_ = w.d.optional(err, "Cluster API owners ("+gvk.Kind+")", "deploy/components/capi") // says once when forbidden
	}
	if err == nil {
		// v1beta2's conditions, and v1beta1's objects' v1beta2 conditions under status.v1beta2.
		for _, path := range [][]string{{"status", "conditions"}, {"status", "v1beta2", "conditions"}} {
			conds, _, _ := unstructured.NestedSlice(u.Object, path...)
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == clusterv1.RollingOutCondition && m["status"] == string(corev1.ConditionTrue) {
					msg, _ := m["message"].(string)
					why = fmt.Sprintf("%s is rolling out (RollingOut: %s)", id, strings.Join(strings.Fields(msg), " "))
				}
			}
		}
	}
	w.rollouts[owner] = why
	return why
}
