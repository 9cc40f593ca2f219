package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub/pass"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// EventSink turns the hub's notices into Kubernetes Events (events.k8s.io/v1) on the machine's
// Cluster API Machine, or its Node, so `kubectl describe` shows what Hale decided and why. Notices are
// queued (the hub never waits for the API server); when the queue is full, notices are dropped and
// counted in the log, never blocking a pass.
type EventSink struct {
	Client    client.Client
	Discovery *Discovery
	// Instance is the reporting instance: the hub replica's name.
	Instance string
	// Hub is what Events about the hub as a whole (no machine) are attached to: its HealthPolicy.
	Hub corev1.ObjectReference
	Log *slog.Logger
	// Retries are the waits before each new try of an Event the API server did not take (unreachable,
	// 5xx, 429: as just after it came back from a quorum loss, when the recovery's Events are said);
	// then the notice is dropped with a warning (its log line and timeline entry remain).
	Retries []time.Duration
	queue   chan pass.Notice
}

// ReportingController names Hale in every Event it writes.
const ReportingController = "hale.dev/hub"

// NewEventSink returns a sink that tries an Event for about 30 s; Run writes its queue.
func NewEventSink(c client.Client, d *Discovery, instance string, log *slog.Logger) *EventSink {
	return &EventSink{Client: c, Discovery: d, Instance: instance, Log: log, queue: make(chan pass.Notice, 256),
		Retries: []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 15 * time.Second}}
}

// Notify is the hub's Config.Notify.
func (s *EventSink) Notify(n pass.Notice) { s.enqueue(n) }

// Carry queues the Events of notices said in an earlier term of this replica, which its sink's Run
// returned unwritten: they are not said again (their log lines, timeline entries and metrics are).
func (s *EventSink) Carry(unwritten []pass.Notice) {
	for _, n := range unwritten {
		s.enqueue(n)
	}
}

func (s *EventSink) enqueue(n pass.Notice) {
	select {
	case s.queue <- n:
	default:
		s.Log.Warn("event queue full: notice dropped", "machine", n.Machine, "reason", n.Reason)
	}
}

// Run writes queued notices as Events until ctx ends, and returns those it did not write: still
// queued, or cut short by ctx's end. A leader's term ends with it, and the next term of the same
// process writes them (an etcd recovery imported just before the API server restarted lost its
// Events with the term).
func (s *EventSink) Run(ctx context.Context) []pass.Notice {
	for {
		select {
		case <-ctx.Done():
			return s.drain(nil)
		case n := <-s.queue:
			err := s.write(ctx, n)
			for i := 0; err != nil && transient(err) && i < len(s.Retries) && ctx.Err() == nil; i++ {
				select {
				case <-ctx.Done():
				case <-time.After(s.Retries[i]):
					err = s.write(ctx, n)
				}
			}
			switch {
			case err != nil && ctx.Err() != nil:
				return s.drain([]pass.Notice{n})
			case err != nil:
				s.Log.Warn("writing an event", "machine", n.Machine, "reason", n.Reason, "err", err)
			}
		}
	}
}

// drain appends what is still queued to unwritten.
func (s *EventSink) drain(unwritten []pass.Notice) []pass.Notice {
	for {
		select {
		case n := <-s.queue:
			unwritten = append(unwritten, n)
		default:
			return unwritten
		}
	}
}

// errNotAttached: a notice with nothing to attach its Event to; trying again does not help.
var errNotAttached = errors.New("no object to attach the Event to")

// transient says whether a write's error may pass: the API server unreachable or answering 5xx or
// 429, not a refusal of the Event itself.
func transient(err error) bool {
	if errors.Is(err, errNotAttached) {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == http.StatusTooManyRequests || code >= http.StatusInternalServerError
	}
	return true
}

func (s *EventSink) write(ctx context.Context, n pass.Notice) error {
	ref := s.Hub
	if n.Machine == "" && ref.Name == "" {
		return fmt.Errorf("%w: a notice about the hub as a whole, and no HealthPolicy (EventSink.Hub unset)", errNotAttached)
	}
	if n.Machine != "" {
		var ok bool
		if ref, ok = s.Discovery.Regarding(n.Machine); !ok {
			return fmt.Errorf("%w: machine %s is not in the discovered inventory", errNotAttached, n.Machine)
		}
		if ref.Name == "" { // a workload cluster's machine without a Machine: its HealthPolicy's
			if ref = s.Hub; ref.Name == "" {
				return fmt.Errorf("%w: machine %s has no Cluster API Machine, and no HealthPolicy (EventSink.Hub unset)", errNotAttached, n.Machine)
			}
		}
	}
	typ := corev1.EventTypeNormal
	if n.Warning {
		typ = corev1.EventTypeWarning
	}
	note := n.Message
	if len(note) > 1024 { // the API server's limit for note
		note = note[:1021] + "..."
	}
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault // Events about cluster-scoped Nodes live in default, as the kubelet's do
	}
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s.%x", strings.ToLower(ref.Name), time.Now().UnixNano())},
		EventTime:  metav1.NewMicroTime(time.Now()), ReportingController: ReportingController, ReportingInstance: s.Instance,
		Action: string(n.Reason), Reason: string(n.Reason), Regarding: ref, Note: note, Type: typ,
	}
	return s.Client.Create(ctx, ev)
}

// Regarding is the object Events about a machine are attached to: its Cluster API Machine, else its
// Node; in a management cluster's cell, where the Node is another API server's, none (ok, an empty
// reference: the EventSink attaches them to the cell's HealthPolicy).
func (d *Discovery) Regarding(machine string) (corev1.ObjectReference, bool) {
	b, ok := d.binding(machine)
	switch {
	case !ok:
		return corev1.ObjectReference{}, false
	case b.machine != nil:
		return corev1.ObjectReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Namespace: b.machine.Namespace, Name: b.machine.Name}, true
	case d.Workload != nil:
		return corev1.ObjectReference{}, true
	}
	return corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: b.node}, true
}
