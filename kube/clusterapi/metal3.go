package clusterapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/bmc"
)

// BareMetalHostGVK is metal3's BareMetalHost, read as unstructured: its Go module is not a
// dependency of Hale (only a few fields are read, and the reboot annotation is written).
var BareMetalHostGVK = schema.GroupVersionKind{Group: "metal3.io", Version: "v1alpha1", Kind: "BareMetalHost"}

// metal3's annotations, as baremetal-operator reads them.
const (
	// RebootAnnotation is Hale's key of metal3's reboot annotation. With a suffix (a key per
	// client), the operator powers the host off and keeps it off until the annotation is removed; its
	// value {"mode":"hard"|"soft"} picks the power-off (none: soft, then hard when soft fails).
	RebootAnnotation = "reboot.metal3.io/hale"
	// HostDetachedAnnotation: the operator stops managing the host; Hale does not act on it either.
	HostDetachedAnnotation = "baremetalhost.metal3.io/detached"
	// HostPausedAnnotation: the operator's reconcile of the host is paused; Hale does not act on it.
	HostPausedAnnotation = "baremetalhost.metal3.io/paused"
)

// HostHold says why Hale must not act on a BareMetalHost, or "".
func HostHold(h *unstructured.Unstructured) string {
	for _, a := range []string{HostDetachedAnnotation, HostPausedAnnotation} {
		if _, ok := h.GetAnnotations()[a]; ok {
			return fmt.Sprintf("BareMetalHost %s/%s is annotated %s: its operator does not act on it, so neither does Hale", h.GetNamespace(), h.GetName(), a)
		}
	}
	// baremetal-operator acts on reboot annotations only in these states (checked against v0.13.2: in
	// available it ignores them, and Hale would wait for a power-off that never comes). A state not
	// yet written (the operator has not reconciled the host) is not held: the annotation waits for it.
	switch state, _, _ := unstructured.NestedString(h.Object, "status", "provisioning", "state"); state {
	case "", "provisioned", "externally provisioned":
	default:
		return fmt.Sprintf("BareMetalHost %s/%s is in state %q: baremetal-operator acts on reboot annotations only on a provisioned "+
			"or externally provisioned host, and a host in another state runs no node of the cluster to heal", h.GetNamespace(), h.GetName(), state)
	}
	return ""
}

// Metal3Host is a machine's power through its metal3 BareMetalHost: baremetal-operator owns the BMC,
// so Hale never calls the BMC itself. A reboot sets Hale's reboot annotation, waits for
// status.poweredOn to say off, removes the annotation and waits for on; a fence (ForceOff) sets it in
// hard mode and leaves it, so the host stays off until an operator's reboot removes it. It is a
// hub.Power.
type Metal3Host struct {
	Client client.Client
	Key    client.ObjectKey
	// Poll and Timeout: how status.poweredOn is awaited (defaults 1 s and 10 min).
	Poll, Timeout time.Duration
}

func (h *Metal3Host) get(ctx context.Context) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(BareMetalHostGVK)
	if err := h.Client.Get(ctx, h.Key, u); err != nil {
		return nil, fmt.Errorf("reading BareMetalHost %s: %w", h.Key, err)
	}
	return u, nil
}

// Status reads status.poweredOn. metal3 reports no reset time: the second value is zero.
func (h *Metal3Host) Status(ctx context.Context) (bmc.PowerState, time.Time, error) {
	u, err := h.get(ctx)
	if err != nil {
		return bmc.PowerUnknown, time.Time{}, err
	}
	return poweredOn(u), time.Time{}, nil
}

func poweredOn(u *unstructured.Unstructured) bmc.PowerState {
	on, found, err := unstructured.NestedBool(u.Object, "status", "poweredOn")
	switch {
	case err != nil || !found:
		return bmc.PowerUnknown
	case on:
		return bmc.PowerOn
	}
	return bmc.PowerOff
}

// Reboot powers the host off (soft, then hard) and on again through the operator.
func (h *Metal3Host) Reboot(ctx context.Context) (bmc.Result, error) { return h.cycle(ctx, "") }

// PowerCycle is a hard reboot through the operator.
func (h *Metal3Host) PowerCycle(ctx context.Context) (bmc.Result, error) { return h.cycle(ctx, "hard") }

// ForceOff powers the host off hard and keeps it off (the annotation stays).
func (h *Metal3Host) ForceOff(ctx context.Context) (bmc.Result, error) {
	res, err := h.powerOff(ctx, "hard")
	if err != nil {
		return res, err
	}
	res.After = bmc.PowerOff
	res.Evidence = fmt.Sprintf("BareMetalHost %s reports poweredOn=false; %s stays until an operator's reboot", h.Key, RebootAnnotation)
	return res, nil
}

func (h *Metal3Host) cycle(ctx context.Context, mode string) (bmc.Result, error) {
	res, err := h.powerOff(ctx, mode)
	if err != nil {
		return res, err
	}
	if err := h.annotate(ctx, nil); err != nil {
		return res, err
	}
	res.Requests = append(res.Requests, "remove "+RebootAnnotation)
	if err := h.await(ctx, bmc.PowerOn); err != nil {
		return res, err
	}
	res.After = bmc.PowerOn
	res.Evidence = fmt.Sprintf("BareMetalHost %s reported poweredOn=false, then true", h.Key)
	return res, nil
}

// powerOff sets the annotation (kept when already there) and waits for the host to report off.
func (h *Metal3Host) powerOff(ctx context.Context, mode string) (bmc.Result, error) {
	st, _, err := h.Status(ctx)
	if err != nil {
		return bmc.Result{}, err
	}
	res := bmc.Result{Endpoint: "BareMetalHost " + h.Key.String(), Before: st, Started: time.Now()}
	value := "{}"
	if mode != "" {
		value = fmt.Sprintf(`{"mode":%q}`, mode)
	}
	if err := h.annotate(ctx, &value); err != nil {
		return res, err
	}
	res.Requests = append(res.Requests, fmt.Sprintf("annotate %s=%s", RebootAnnotation, value))
	return res, h.await(ctx, bmc.PowerOff)
}

// annotate sets (value != nil) or removes Hale's reboot annotation, after checking the host is not
// detached or paused.
func (h *Metal3Host) annotate(ctx context.Context, value *string) error {
	u, err := h.get(ctx)
	if err != nil {
		return err
	}
	if why := HostHold(u); why != "" && value != nil { // Hale's own annotation may always go
		return errors.New(why)
	}
	before := u.DeepCopy()
	a := u.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	if value == nil {
		delete(a, RebootAnnotation)
	} else {
		a[RebootAnnotation] = *value
	}
	u.SetAnnotations(a)
	if err := h.Client.Patch(ctx, u, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("annotating BareMetalHost %s: %w", h.Key, err)
	}
	return nil
}

func (h *Metal3Host) await(ctx context.Context, want bmc.PowerState) error {
	poll, timeout := h.Poll, h.Timeout
	if poll <= 0 {
		poll = time.Second
	}
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	deadline := time.Now().Add(timeout)
	for {
		st, _, err := h.Status(ctx)
		if err == nil && st == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("BareMetalHost %s: status.poweredOn did not say %s within %v (last: %s, %v): is baremetal-operator running?", h.Key, want, timeout, st, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}
