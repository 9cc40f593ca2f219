// Package enrol is the hub's side of identity enrolment in Kubernetes mode: per-node identities need
// no key step by hand. An agent enrols its identity key
// through the API server, as a kubelet bootstraps its certificate: it creates a
// CertificateSigningRequest of signer identity.IdentitySigner whose key is its identity key and whose common
// name is its node. The API server records who asked: the agent's service account, and (its token
// being bound to its pod) the node the pod runs on, in spec.extra. The leading hub pins the key for
// that node in the PinnedKeys ConfigMap, only when the request came from an agent's service account
// and names the node the API server says it came from, and approves the request; it denies any other
// with the reason. Every agent and hub reads the ConfigMap: a key is pinned everywhere seconds after
// its agent started. A stolen gossip key alone still speaks for no one, and no one can enrol a key for
// a node without a token of a pod of Hale's agents running on that node.
package enrol

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/health/identity"
)

// NodeNameExtra is where the API server records the node of the pod a service account token is
// bound to, in a request's user extra.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// PodNameExtra is where the API server records the pod a service account token is bound to.
const PodNameExtra = "authentication.kubernetes.io/pod-name"

// pinnedHeader heads the ConfigMap's pinned keys.
const pinnedHeader = "Kept by Hale's hub: each agent's node key as it enrolled (kubectl get csr), each hub replica's own.\nEdit by hand only to remove a node for good; the hub adds and replaces lines."

// PinnedKeys is the ConfigMap holding every member's pinned key in Kubernetes mode. The hub writes
// it; agents and hubs read it.
type PinnedKeys struct {
	Client client.Client
	Key    client.ObjectKey
}

// Read returns the pinned keys (none when the ConfigMap has none yet).
func (p PinnedKeys) Read(ctx context.Context) ([]identity.PinLine, error) {
	_, lines, err := p.read(ctx)
	return lines, err
}

// Pinned returns the pinned keys as a member verifies by them, and their text (a change is told by it).
func (p PinnedKeys) Pinned(ctx context.Context) (identity.Pinned, string, error) {
	cm, _, err := p.read(ctx)
	if err != nil {
		return identity.Pinned{}, "", err
	}
	text := cm.Data[identity.PinnedKeysKey]
	pinned, err := identity.ParsePinned([]byte(text), "ConfigMap "+p.Key.String())
	return pinned, text, err
}

// read returns the ConfigMap and the pinned keys in it.
func (p PinnedKeys) read(ctx context.Context) (corev1.ConfigMap, []identity.PinLine, error) {
	var cm corev1.ConfigMap
	if err := p.Client.Get(ctx, p.Key, &cm); err != nil {
		return cm, nil, fmt.Errorf("reading the pinned keys (ConfigMap %s): %w", p.Key, err)
	}
	lines, err := identity.ParsePinLines([]byte(cm.Data[identity.PinnedKeysKey]), "ConfigMap "+p.Key.String())
	return cm, lines, err
}

// Pin makes key the one pinned for name (a node, or hub-POD-* for a hub replica), replacing the
// name's earlier lines: a node enrols a new key when its disk was replaced, and the old one went with
// it. It says whether the ConfigMap changed.
func (p PinnedKeys) Pin(ctx context.Context, name string, key identity.PublicKey) (bool, error) {
	return p.edit(ctx, func(lines []identity.PinLine) []identity.PinLine {
		pin := identity.PinLine{Name: name, Key: key}
		out := slices.DeleteFunc(slices.Clone(lines), func(l identity.PinLine) bool { return l.Name == name })
		if len(out) == len(lines)-1 && slices.ContainsFunc(lines, func(l identity.PinLine) bool { return l.String() == pin.String() }) {
			return lines // pinned already, alone
		}
		return append(out, pin)
	})
}

// Unpin removes the lines whose names drop says to.
func (p PinnedKeys) Unpin(ctx context.Context, drop func(name string) bool) (bool, error) {
	return p.edit(ctx, func(lines []identity.PinLine) []identity.PinLine {
		return slices.DeleteFunc(slices.Clone(lines), func(l identity.PinLine) bool { return drop(l.Name) })
	})
}

// edit rewrites the pinned keys with change (given the lines in force, it returns the new ones; the
// same length and lines: no change), retrying on a conflicting write.
func (p PinnedKeys) edit(ctx context.Context, change func([]identity.PinLine) []identity.PinLine) (bool, error) {
	changed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, lines, err := p.read(ctx)
		if err != nil {
			return err
		}
		next := change(lines)
		if slices.EqualFunc(lines, next, func(a, b identity.PinLine) bool { return a.String() == b.String() }) {
			return nil
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[identity.PinnedKeysKey] = identity.FormatPinLines(pinnedHeader, next)
		if err := p.Client.Update(ctx, &cm); err != nil {
			return err
		}
		changed = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("writing the pinned keys (ConfigMap %s): %w", p.Key, err)
	}
	return changed, nil
}

// HubPinName is the name a hub replica's key is pinned for: every gossip name the replica takes
// (hub-POD-RANDOM, new at each start).
func HubPinName(pod string) string { return "hub-" + pod + "-*" }

// Enroller pins the keys members enrol (the leading hub's). Agents are the service accounts (as user
// names, system:serviceaccount:NS:NAME) whose requests pin a node's key: the agents' and the
// witnesses'. Hubs are the hub's: its requests pin a replica's key for the names of its pod
// (HubPinName).
type Enroller struct {
	Client client.Client
	Pinned PinnedKeys
	Agents []string
	Hubs   []string
	Log    *slog.Logger
}

// Accounts are the user names of the service accounts names in namespace ns (Enroller's Agents, Hubs).
func Accounts(ns string, names []string) []string {
	var out []string
	for _, n := range names {
		out = append(out, "system:serviceaccount:"+ns+":"+n)
	}
	return out
}

// Run answers the members' enrolments (Pass) every identity.EnrolmentInterval until ctx ends, and
// after each pass calls then, when set.
func (e *Enroller) Run(ctx context.Context, then func(context.Context)) {
	var said string
	for {
		if err := e.Pass(ctx); err != nil && ctx.Err() == nil && err.Error() != said {
			e.Log.Warn("enrolment: the pinned keys cannot be kept now", "err", err)
			said = err.Error()
		}
		if then != nil {
			then(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(identity.EnrolmentInterval):
		}
	}
}

// Pass answers every pending enrolment: pinned and approved, or denied with the reason. Then it
// unpins the hub replicas that are gone (their pods deleted).
func (e *Enroller) Pass(ctx context.Context) error {
	var csrs certificatesv1.CertificateSigningRequestList
	if err := e.Client.List(ctx, &csrs, client.MatchingFields{"spec.signerName": identity.IdentitySigner}); err != nil {
		return fmt.Errorf("listing the enrolments (CertificateSigningRequests of %s): %w", identity.IdentitySigner, err)
	}
	var errs []error
	for i := range csrs.Items {
		csr := &csrs.Items[i]
		if csr.Spec.SignerName != identity.IdentitySigner || answered(csr) {
			continue
		}
		node, key, why := e.check(csr)
		if why != "" {
			errs = append(errs, e.answer(ctx, csr, certificatesv1.CertificateDenied, "NotAHaleMember", why))
			e.Log.Warn("enrolment denied", "csr", csr.Name, "user", csr.Spec.Username, "why", why)
			continue
		}
		changed, err := e.Pinned.Pin(ctx, node, key)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, e.answer(ctx, csr, certificatesv1.CertificateApproved, "Pinned", fmt.Sprintf("the key of %s pinned in ConfigMap %s", node, e.Pinned.Key)))
		if changed {
			e.Log.Info("enrolment: key pinned", "name", node, "key", key.String(), "csr", csr.Name)
		}
	}
	errs = append(errs, e.unpinGoneHubs(ctx))
	return errors.Join(errs...)
}

// check returns the name and key a request enrols, or why it may not: for an agent's account, the
// node the API server says the requester's pod runs on; for the hub's, the names of its pod.
func (e *Enroller) check(csr *certificatesv1.CertificateSigningRequest) (string, identity.PublicKey, string) {
	var want string
	switch {
	case slices.Contains(e.Agents, csr.Spec.Username):
		nodes := csr.Spec.Extra[NodeNameExtra]
		if len(nodes) != 1 || nodes[0] == "" {
			return "", nil, "the request carries no node: the requester's token is not bound to a pod on a node (an agent's own projected token is)"
		}
		want = nodes[0]
	case slices.Contains(e.Hubs, csr.Spec.Username):
		pods := csr.Spec.Extra[PodNameExtra]
		if len(pods) != 1 || pods[0] == "" {
			return "", nil, "the request carries no pod: the requester's token is not bound to a pod (a hub replica's own projected token is)"
		}
		want = HubPinName(pods[0])
	default:
		return "", nil, fmt.Sprintf("requested by %q, not by a Hale agent's or hub's service account (%s)", csr.Spec.Username, strings.Join(append(slices.Clone(e.Agents), e.Hubs...), ", "))
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return "", nil, "spec.request is not a PEM certificate request"
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return "", nil, fmt.Sprintf("spec.request: %v", err)
	}
	if err := req.CheckSignature(); err != nil {
		return "", nil, fmt.Sprintf("spec.request is not signed by its own key: %v", err)
	}
	key, ok := req.PublicKey.(ed25519.PublicKey)
	if !ok {
		return "", nil, fmt.Sprintf("spec.request's key is %s, not Ed25519 (a member's identity key)", req.PublicKeyAlgorithm)
	}
	if req.Subject.CommonName != want {
		return "", nil, fmt.Sprintf("the request names %q, but its requester may enrol only %q (the node its pod runs on; for a hub, its pod's names)", req.Subject.CommonName, want)
	}
	return want, identity.PublicKey(key), ""
}

// answer approves or denies csr with reason and message.
func (e *Enroller) answer(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, kind certificatesv1.RequestConditionType, reason, msg string) error {
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: kind, Status: corev1.ConditionTrue,
		Reason: reason, Message: msg, LastUpdateTime: metav1.Now()})
	if err := e.Client.SubResource("approval").Update(ctx, csr); err != nil {
		return fmt.Errorf("answering enrolment %s (%s): %w", csr.Name, kind, err)
	}
	return nil
}

// answered: approved or denied already.
func answered(csr *certificatesv1.CertificateSigningRequest) bool {
	return slices.ContainsFunc(csr.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
		return c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied
	})
}

// unpinGoneHubs removes the lines of hub replicas whose pods no longer exist: each replica pins its
// own key at start, under a name of its pod.
func (e *Enroller) unpinGoneHubs(ctx context.Context) error {
	lines, err := e.Pinned.Read(ctx)
	if err != nil {
		return err
	}
	gone := map[string]bool{}
	for _, l := range lines {
		pod, ok := strings.CutPrefix(strings.TrimSuffix(l.Name, "-*"), "hub-")
		if !ok || !strings.HasSuffix(l.Name, "-*") {
			continue
		}
		err := e.Client.Get(ctx, client.ObjectKey{Namespace: e.Pinned.Key.Namespace, Name: pod}, &corev1.Pod{})
		switch {
		case apierrors.IsNotFound(err):
			gone[l.Name] = true
		case err != nil:
			return fmt.Errorf("reading hub replica pod %s: %w", pod, err)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	_, err = e.Pinned.Unpin(ctx, func(name string) bool { return gone[name] })
	if err == nil {
		e.Log.Info("enrolment: unpinned hub replicas that are gone", "names", slices.Sorted(maps.Keys(gone)))
	}
	return err
}
