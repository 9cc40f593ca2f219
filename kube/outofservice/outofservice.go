// Package outofservice puts Kubernetes' out-of-service taint on the Nodes of fenced machines, and
// takes off the ones it put on (hub/taints' Nodes, on the API server).
package outofservice

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hale-dev/hale/hub/taints"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Annotation marks a Node whose out-of-service taint Hale put on (its value says why):
// Hale takes off only a taint it put on, never one an operator did.
const Annotation = "hale.dev/out-of-service"

// Taint is Kubernetes' non-graceful node shutdown taint, as its documentation writes it.
var Taint = corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}

// Taints is taints.Nodes on the API server's Nodes.
type Taints struct{ Client client.Client }

var _ taints.Nodes = Taints{}

// Tainted lists the Nodes whose out-of-service taint Hale put on.
func (t Taints) Tainted(ctx context.Context) ([]string, error) {
	var nodes corev1.NodeList
	if err := t.Client.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	var out []string
	for _, n := range nodes.Items {
		if _, ours := n.Annotations[Annotation]; ours && Has(&n) {
			out = append(out, n.Name)
		}
	}
	return out, nil
}

// Taint puts the out-of-service taint on node with the annotation that says Hale did and why; a Node
// that has the taint already (an operator's) is left as it is.
func (t Taints) Taint(ctx context.Context, node, why string) error {
	return t.update(ctx, node, func(n *corev1.Node) bool {
		if Has(n) {
			return false
		}
		taint := Taint
		taint.TimeAdded = &metav1.Time{Time: time.Now()}
		n.Spec.Taints = append(n.Spec.Taints, taint)
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[Annotation] = why
		return true
	})
}

// Untaint takes the out-of-service taint off node if Hale put it on; a Node gone is nothing to do.
func (t Taints) Untaint(ctx context.Context, node string) error {
	err := t.update(ctx, node, func(n *corev1.Node) bool {
		if _, ours := n.Annotations[Annotation]; !ours {
			return false
		}
		delete(n.Annotations, Annotation)
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeOutOfService })
		return true
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// update reads node, lets change it (false: nothing to write) and writes it, again on a conflict.
func (t Taints) update(ctx context.Context, node string, change func(*corev1.Node) bool) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := t.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		if !change(&n) {
			return nil
		}
		return t.Client.Update(ctx, &n)
	})
	if err != nil {
		return fmt.Errorf("updating node %s: %w", node, err)
	}
	return nil
}

// Has says whether n has the out-of-service taint (anyone's).
func Has(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeOutOfService })
}
