// Package metal3sim stands in for metal3's baremetal-operator in tests, for the one behaviour Hale
// relies on: the reboot annotation. baremetal-operator needs Ironic, which cannot run here; this loop
// follows the operator's documented contract (metal3 user guide, "Reboot annotation") against each
// host's BMC through Hale's own Redfish client: while any reboot.metal3.io annotation is on a host it
// is powered off (mode hard: forced off; otherwise soft, then hard) and kept off; once none is left
// and spec.online is true it is powered on; status.poweredOn reports the BMC's power state. Detached
// and paused hosts are left alone, as the operator does.
package metal3sim

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/pass"
)

// The operator's side of metal3's contract, spelled out here rather than imported from Hale's kube
// package (which the stand-in checks).
var hostListGVK = schema.GroupVersionKind{Group: "metal3.io", Version: "v1alpha1", Kind: "BareMetalHostList"}

const (
	rebootAnnotation   = "reboot.metal3.io"
	detachedAnnotation = "baremetalhost.metal3.io/detached"
	pausedAnnotation   = "baremetalhost.metal3.io/paused"
)

// Operator reconciles BareMetalHosts in Namespace against their BMCs every Interval.
type Operator struct {
	Client    client.Client
	Namespace string
	// Power returns the BMC controller of a host (by name).
	Power    func(host string) (*bmc.Controller, error)
	Interval time.Duration
	Log      *slog.Logger
}

// InventoryPower is an Operator's Power for hosts named after the nodes of inv's machines: each
// machine's own BMC, with short verification timeouts for tests.
func InventoryPower(inv pass.Inventory) func(host string) (*bmc.Controller, error) {
	return func(host string) (*bmc.Controller, error) {
		for _, m := range inv.Machines {
			if m.Node == host {
				return bmc.New(m.Endpoint, m.Credentials, bmc.Options{PollInterval: 20 * time.Millisecond, VerifyTimeout: 10 * time.Second, GracefulTimeout: time.Second})
			}
		}
		return nil, fmt.Errorf("metal3sim: no BMC for host %s", host)
	}
}

// Run reconciles until ctx ends.
func (o *Operator) Run(ctx context.Context) {
	for {
		o.reconcileAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(o.Interval):
		}
	}
}

func (o *Operator) reconcileAll(ctx context.Context) {
	hosts := &unstructured.UnstructuredList{}
	hosts.SetGroupVersionKind(hostListGVK)
	if err := o.Client.List(ctx, hosts, client.InNamespace(o.Namespace)); err != nil {
		o.Log.Warn("metal3sim: listing hosts", "err", err)
		return
	}
	for i := range hosts.Items {
		if err := o.reconcile(ctx, &hosts.Items[i]); err != nil && ctx.Err() == nil {
			o.Log.Warn("metal3sim: reconciling", "host", hosts.Items[i].GetName(), "err", err)
		}
	}
}

func (o *Operator) reconcile(ctx context.Context, h *unstructured.Unstructured) error {
	a := h.GetAnnotations()
	if _, ok := a[detachedAnnotation]; ok {
		return nil
	}
	if _, ok := a[pausedAnnotation]; ok {
		return nil
	}
	power, err := o.Power(h.GetName())
	if err != nil {
		return err
	}
	st, _, err := power.Status(ctx)
	if err != nil {
		return err
	}
	hard, off := false, false
	for k, v := range a {
		if k == rebootAnnotation || strings.HasPrefix(k, rebootAnnotation+"/") {
			off = true
			var mode struct{ Mode string }
			_ = json.Unmarshal([]byte(v), &mode)
			hard = hard || mode.Mode == "hard"
		}
	}
	online, _, _ := unstructured.NestedBool(h.Object, "spec", "online")
	switch {
	case off && st == bmc.PowerOn && hard:
		_, err = power.ForceOff(ctx)
	case off && st == bmc.PowerOn:
		_, err = power.PowerOff(ctx)
	case !off && online && st == bmc.PowerOff:
		_, err = power.PowerOn(ctx)
	}
	if err != nil {
		return err
	}
	if st, _, err = power.Status(ctx); err != nil {
		return err
	}
	if on, _, _ := unstructured.NestedBool(h.Object, "status", "poweredOn"); on == (st == bmc.PowerOn) && h.Object["status"] != nil {
		return nil
	}
	before := h.DeepCopy()
	if err := unstructured.SetNestedField(h.Object, st == bmc.PowerOn, "status", "poweredOn"); err != nil {
		return err
	}
	return o.Client.Status().Patch(ctx, h, client.MergeFrom(before))
}
