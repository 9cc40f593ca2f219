package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/kube/enrol"
)

// cellPinned are a cell's pinned keys: its workload cluster's (the ConfigMap the agents there read
// and enrol into), the management hub's own key among them.
type cellPinned struct {
	pk   enrol.PinnedKeys
	keys identity.Pinned
	text string // the ConfigMap's text keys were read from
	said string // the last error said
}

// pinCell pins this hub's key in the workload cluster's pinned keys, by which the agents there verify
// the cell's reports, and returns them. It makes the ConfigMap when the agents' install has not.
func (m *management) pinCell(ctx context.Context, pk enrol.PinnedKeys, cluster client.ObjectKey) (*cellPinned, error) {
	err := pk.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: pk.Key.Namespace, Name: pk.Key.Name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("the pinned keys in the workload cluster of Cluster API Cluster %s (ConfigMap %s: are Hale's agents installed there?): %w", cluster, pk.Key, err)
	}
	p := &cellPinned{pk: pk}
	if err := p.pinSelf(ctx, m); err != nil {
		return nil, fmt.Errorf("the workload cluster of Cluster API Cluster %s: %w", cluster, err)
	}
	return p, nil
}

// pinSelf pins the hub's key (as m.pinAs) unless it is pinned already, and reads the pinned keys.
func (p *cellPinned) pinSelf(ctx context.Context, m *management) error {
	keys, text, err := p.pk.Pinned(ctx)
	if err == nil && !slices.ContainsFunc(keys.Keys(m.o.node), func(k identity.PublicKey) bool { return k.String() == m.identity.Public().String() }) {
		if _, err = p.pk.Pin(ctx, m.pinAs, m.identity.Public()); err == nil {
			keys, text, err = p.pk.Pinned(ctx)
		}
	}
	if err == nil {
		p.keys, p.text = keys, text
	}
	return err
}

// refresh hands g the workload cluster's pinned keys when they changed (pinning the hub's key again
// if it was taken out by hand); when they cannot be read, the last ones stay.
func (p *cellPinned) refresh(ctx context.Context, g *health.Gossip, m *management, log *slog.Logger) {
	last := p.text
	switch err := p.pinSelf(ctx, m); {
	case err != nil && ctx.Err() == nil && err.Error() != p.said:
		log.Warn("pinned keys: cannot read them from the workload cluster; the last ones stay", "err", err)
		p.said = err.Error()
	case err == nil && p.text != last:
		g.SetPinned(p.keys)
		p.said = ""
		log.Info("pinned keys: read from the workload cluster", "configMap", p.pk.Key.String(), "entries", p.keys.Len())
	}
}
