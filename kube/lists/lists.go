// Package lists serves the lists that many pollers repeat from one informer cache of an API server
// (a management-mode hub's cells: kube.RequestSync's Lists).
package lists

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// Shared serves the lists that many pollers repeat (each cell of a management-mode hub lists its
// Remediations, Machines and HaleRemediations every second) from one informer cache of the API
// server, started here: a watch per kind for every poller instead of a list per poller each second.
// What a poll finds there is a candidate, a few milliseconds old or more; whoever acts on one reads
// it live first (RequestSync does), since a cache that has not seen a write yet would have it acted
// on twice. A kind whose informer does not sync within SyncWait (its watch forbidden, say) is listed
// live from then on, said once in the log with the reason.
type Shared struct {
	cache  cache.Cache
	live   client.Reader
	scheme *runtime.Scheme
	log    *slog.Logger
	// SyncWait is how long a kind's first list waits for its informer to sync (default 10 s).
	SyncWait time.Duration

	mu     sync.Mutex
	listed map[schema.GroupVersionKind]bool // kinds listed live
}

// New starts an informer cache of the API server cfg names (informers start as kinds are
// first listed) until ctx ends; live serves the kinds it cannot.
func New(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, live client.Reader, log *slog.Logger) (*Shared, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 0 // a watch is one long request: a client's timeout would end it every few seconds
	c, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("the shared informer cache of %s: %w", cfg.Host, err)
	}
	go func() {
		if err := c.Start(ctx); err != nil && ctx.Err() == nil {
			log.Warn("the shared informer cache stopped: the polls read the API server", "err", err)
		}
	}()
	if !c.WaitForCacheSync(ctx) { // started (no informer yet): a list before that fails at once
		return nil, fmt.Errorf("starting the shared informer cache of %s: %w", cfg.Host, ctx.Err())
	}
	return &Shared{cache: c, live: live, scheme: scheme, log: log, listed: map[schema.GroupVersionKind]bool{}}, nil
}

// List lists from the cache, or live for a kind the cache cannot serve.
func (s *Shared) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	gvk, err := apiutil.GVKForObject(list, s.scheme)
	if err != nil {
		return s.live.List(ctx, list, opts...)
	}
	s.mu.Lock()
	_, live := s.listed[gvk]
	s.mu.Unlock()
	if live {
		return s.live.List(ctx, list, opts...)
	}
	cctx, cancel := context.WithTimeout(ctx, cmp.Or(s.SyncWait, 10*time.Second))
	err = s.cache.List(cctx, list, opts...)
	cancel()
	switch {
	case err == nil, ctx.Err() != nil:
		return err
	case meta.IsNoMatchError(err):
		return err // no such kind on the API server: as a live list says
	}
	kind := strings.TrimSuffix(gvk.Kind, "List")
	s.mu.Lock()
	s.listed[gvk] = true
	s.mu.Unlock()
	s.log.Warn("the shared cache cannot list this kind: listed from the API server at each poll from now on (does the hub's ClusterRole grant list and watch on it?)",
		"kind", kind, "group", gvk.Group, "err", err)
	if obj, err := s.scheme.New(gvk.GroupVersion().WithKind(kind)); err == nil {
		if o, ok := obj.(client.Object); ok {
			_ = s.cache.RemoveInformer(ctx, o) // its watch would be retried forever
		}
	}
	return s.live.List(ctx, list, opts...)
}
