// Package lists serves the lists and reads that many pollers repeat from one informer cache of an API
// server (a management-mode hub's cells: kube.RequestSync's Lists, kube.PolicySync's Cache).
package lists

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/resourceversion"
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
// on twice. Get reads one object there, no older than the last write of it that Wrote recorded. A
// kind whose informer does not sync within SyncWait (its watch forbidden, say) is listed and read live
// from then on, said once in the log with the reason.
type Shared struct {
	cache  cache.Cache
	live   client.Reader
	scheme *runtime.Scheme
	log    *slog.Logger
	// SyncWait is how long a kind's first list waits for its informer to sync (default 10 s).
	SyncWait time.Duration

	mu     sync.Mutex
	listed map[schema.GroupVersionKind]bool // kinds (of objects, not lists) served live
	floors map[floorKey]string              // the resourceVersion of this process's last write of an object
}

type floorKey struct {
	gvk schema.GroupVersionKind
	key client.ObjectKey
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
	return &Shared{cache: c, live: live, scheme: scheme, log: log, listed: map[schema.GroupVersionKind]bool{}, floors: map[floorKey]string{}}, nil
}

// List lists from the cache, or live for a kind the cache cannot serve.
func (s *Shared) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	gvk, err := apiutil.GVKForObject(list, s.scheme)
	if err != nil {
		return s.live.List(ctx, list, opts...)
	}
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List") // the kind's, as Get knows it
	if s.isLive(gvk) {
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
	s.goLive(ctx, gvk, err)
	return s.live.List(ctx, list, opts...)
}

// Get reads key into obj from the cache, or live when the cache cannot serve its kind, has no such
// object, or holds one older than this process's last write of it (Wrote): a hub that just wrote a
// pause must not read it undone. resourceVersions are compared as Kubernetes defines it for objects of
// one resource (k8s.io/apimachinery/pkg/util/resourceversion); one that cannot be compared is read
// live.
func (s *Shared) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	gvk, err := apiutil.GVKForObject(obj, s.scheme)
	if err != nil || s.isLive(gvk) {
		return s.live.Get(ctx, key, obj, opts...)
	}
	s.mu.Lock()
	floor := s.floors[floorKey{gvk, key}]
	s.mu.Unlock()
	// Read into a copy: a read that is refused must leave nothing behind in obj (a live read decodes
	// into what is there, and an annotation the cache still had would survive it).
	cached, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return s.live.Get(ctx, key, obj, opts...)
	}
	cctx, cancel := context.WithTimeout(ctx, cmp.Or(s.SyncWait, 10*time.Second))
	err = s.cache.Get(cctx, key, cached)
	cancel()
	switch {
	case err == nil && atLeast(cached.GetResourceVersion(), floor):
		reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(cached).Elem())
		return nil
	case err == nil, apierrors.IsNotFound(err), ctx.Err() != nil, meta.IsNoMatchError(err):
	default:
		s.goLive(ctx, gvk, err)
	}
	return s.live.Get(ctx, key, obj, opts...)
}

// Wrote records obj, as this process just wrote it (the object the write returned): Get reads it
// from the cache only once the cache holds that write or a later one.
func (s *Shared) Wrote(obj client.Object) {
	gvk, err := apiutil.GVKForObject(obj, s.scheme)
	rv := obj.GetResourceVersion()
	if err != nil || rv == "" {
		return
	}
	k := floorKey{gvk, client.ObjectKeyFromObject(obj)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.floors[k]; cur != "" && atLeast(cur, rv) {
		return // a later write is recorded already
	}
	s.floors[k] = rv
}

// atLeast says whether resourceVersion rv is floor or later (true when there is no floor).
func atLeast(rv, floor string) bool {
	if floor == "" {
		return true
	}
	c, err := resourceversion.CompareResourceVersion(rv, floor)
	return err == nil && c >= 0
}

func (s *Shared) isLive(gvk schema.GroupVersionKind) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listed[gvk]
}

// goLive serves kind from the API server from now on: its informer did not sync (err).
func (s *Shared) goLive(ctx context.Context, gvk schema.GroupVersionKind, err error) {
	s.mu.Lock()
	s.listed[gvk] = true
	s.mu.Unlock()
	s.log.Warn("the shared cache cannot serve this kind: read from the API server each time from now on (does the hub's ClusterRole grant list and watch on it?)",
		"kind", gvk.Kind, "group", gvk.Group, "err", err)
	if obj, err := s.scheme.New(gvk); err == nil {
		if o, ok := obj.(client.Object); ok {
			_ = s.cache.RemoveInformer(ctx, o) // its watch would be retried forever
		}
	}
}
