package hub

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub/pass"
)

// BrakeStore keeps the operator's brakes: the bbolt journal in standalone mode; in Kubernetes mode the
// HealthPolicy, so that `hub pause` over the socket and `kubectl patch healthpolicy` are one brake.
type BrakeStore interface {
	LoadBrakes(ctx context.Context) (pass.Brakes, error)
	SaveBrakes(ctx context.Context, b pass.Brakes) error
}

// wakeIfResumed wakes the executors held at a checkpoint (gate) when the last brake that holds steps
// was just lifted, and notes when (the evidence the hub acts on counts from there: observe). Callers
// hold h.mu.
func (h *Hub) wakeIfResumed(wasHeld bool) {
	if wasHeld && !h.stepsHeld() {
		close(h.resumed)
		h.resumed = make(chan struct{})
		h.resumedAt = time.Now()
	}
}

// isPaused: a pause from any source holds. Callers hold h.mu.
func (h *Hub) isPaused() bool { return h.brakes.Paused != nil || len(h.pauses) > 0 }

// stepsHeld: no step of a remediation in flight starts while the hub is paused or suspended
// (observe-only executes nothing; a step under way finishes). Callers hold h.mu.
func (h *Hub) stepsHeld() bool { return h.isPaused() || h.brakes.Suspended != nil }

// pausedBy lists every pause in force, the operator's first. Callers hold h.mu.
func (h *Hub) pausedBy() []pass.Brake {
	var out []pass.Brake
	if h.brakes.Paused != nil {
		out = append(out, *h.brakes.Paused)
	}
	for _, k := range slices.Sorted(maps.Keys(h.pauses)) {
		out = append(out, h.pauses[k])
	}
	return out
}

// setBrake changes the operator's brakes with change, records it in the BrakeStore, and tells what
// changed. The brake is in force at once, even when it could not be recorded: then the error says
// that it will not survive a restart.
func (h *Hub) setBrake(ctx context.Context, what string, change func(*pass.Brakes) bool) error {
	h.mu.Lock()
	wasHeld := h.stepsHeld()
	next := h.brakes.Clone()
	if !change(&next) {
		h.mu.Unlock()
		return nil
	}
	h.brakes = next
	h.wakeIfResumed(wasHeld)
	h.brakeSeq++ // odd: a save in flight
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.brakeSeq++
		h.mu.Unlock()
	}()
	h.say(pass.Notice{Reason: pass.ReasonBrake, Message: what})
	if h.cfg.Brakes == nil {
		return nil
	}
	if err := h.cfg.Brakes.SaveBrakes(ctx, next); err != nil {
		h.say(pass.Notice{Reason: pass.ReasonBrakeNotRecorded, Warning: true,
			Message: fmt.Sprintf("could not record the brake (%s): it holds now but not across a restart: %v", what, err)})
		return fmt.Errorf("%s: in force, but not recorded (it will not survive a restart): %w", what, err)
	}
	return nil
}

// SetPaused pauses (no new step starts; steps in progress finish) or resumes the hub, for the operator
// (by names who). A resume takes back only the operator's pause: a pause from another source (a
// paused Cluster API Cluster) holds until that source lets go.
func (h *Hub) SetPaused(ctx context.Context, on bool, by, reason string) error {
	if !on {
		// A recovery whose survivor answers as a new cluster is closed first, so that the hub does
		// not pause itself again for it at its next start (pauseIfRecovering).
		if _, err := h.underway(ctx); err != nil {
			h.log.Warn("reading the recovery journal", "err", err)
		}
	}
	return h.setHubBrake(ctx, func(b *pass.Brakes) **pass.Brake { return &b.Paused }, on, by, reason, "paused", "resumed")
}

// SetSuspended makes the hub observe-only (everything is assessed and planned and what it would
// start is reported, nothing is executed), or acting again.
func (h *Hub) SetSuspended(ctx context.Context, on bool, by, reason string) error {
	return h.setHubBrake(ctx, func(b *pass.Brakes) **pass.Brake { return &b.Suspended }, on, by, reason, "suspended (observe-only)", "unsuspended")
}

// setHubBrake sets or lifts the brake field picks out.
func (h *Hub) setHubBrake(ctx context.Context, field func(*pass.Brakes) **pass.Brake, on bool, by, reason, onWord, offWord string) error {
	what := fmt.Sprintf("%s by %s", onWord, by)
	if !on {
		what = fmt.Sprintf("%s by %s", offWord, by)
	}
	return h.setBrake(ctx, what, func(b *pass.Brakes) bool {
		f := field(b)
		if on == (*f != nil) {
			return false
		}
		*f = nil
		if on {
			*f = &pass.Brake{By: by, Reason: reason, Since: time.Now().UTC()}
		}
		return true
	})
}

// SetDetached detaches a machine (no probe-driven action and no BMC call for it) or attaches it again.
func (h *Hub) SetDetached(ctx context.Context, machine string, on bool, by, reason string) error {
	if _, ok := h.inventory().Machine(machine); !ok {
		return fmt.Errorf("machine %q: %w", machine, ErrNotFound)
	}
	what := fmt.Sprintf("%s detached by %s", machine, by)
	if !on {
		what = fmt.Sprintf("%s attached by %s", machine, by)
	}
	return h.setBrake(ctx, what, func(b *pass.Brakes) bool {
		if _, is := b.Detached[machine]; is == on {
			return false
		}
		if on {
			if b.Detached == nil {
				b.Detached = map[string]pass.Brake{}
			}
			b.Detached[machine] = pass.Brake{By: by, Reason: reason, Since: time.Now().UTC()}
		} else {
			delete(b.Detached, machine)
		}
		return true
	})
}

// BrakeSeq counts the hub's own brake changes (odd while one is being recorded). Take it before
// reading the BrakeStore, and give it to ApplyBrakes.
func (h *Hub) BrakeSeq() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.brakeSeq
}

// ApplyBrakes puts brakes read from the BrakeStore in force (Kubernetes mode: the HealthPolicy, as
// kubectl may have changed it); what changed is told. seq is BrakeSeq from before the read: a read
// that began before the hub changed a brake itself, or while it was recording one, is older than that
// change and is not applied (it would take the change back).
func (h *Hub) ApplyBrakes(seq uint64, b pass.Brakes) {
	h.mu.Lock()
	if seq != h.brakeSeq || seq%2 == 1 {
		h.mu.Unlock()
		return
	}
	before, wasHeld := h.brakes, h.stepsHeld()
	h.brakes = b.Clone()
	h.wakeIfResumed(wasHeld)
	h.mu.Unlock()
	for _, c := range brakeChanges(before, b) {
		h.say(pass.Notice{Reason: pass.ReasonBrake, Message: c})
	}
}

func brakeChanges(a, b pass.Brakes) []string {
	var out []string
	flip := func(x, y *pass.Brake, on, off string) {
		switch {
		case x == nil && y != nil:
			out = append(out, fmt.Sprintf("%s by %s", on, y))
		case x != nil && y == nil:
			out = append(out, off)
		}
	}
	flip(a.Paused, b.Paused, "paused", "the operator's pause lifted")
	flip(a.Suspended, b.Suspended, "suspended (observe-only)", "unsuspended")
	for _, m := range slices.Sorted(maps.Keys(b.Detached)) {
		if _, was := a.Detached[m]; !was {
			out = append(out, fmt.Sprintf("%s detached by %s", m, b.Detached[m]))
		}
	}
	for _, m := range slices.Sorted(maps.Keys(a.Detached)) {
		if _, is := b.Detached[m]; !is {
			out = append(out, m+" attached")
		}
	}
	return out
}

// SetPause sets or lifts the pause of a source other than the operator (source names it, e.g.
// "Cluster API Cluster ns/name"); any pause holds.
func (h *Hub) SetPause(source string, on bool, reason string) {
	h.mu.Lock()
	wasHeld := h.stepsHeld()
	_, had := h.pauses[source]
	switch {
	case on && !had:
		h.pauses[source] = pass.Brake{By: source, Reason: reason, Since: time.Now().UTC()}
	case !on && had:
		delete(h.pauses, source)
	}
	h.wakeIfResumed(wasHeld)
	h.mu.Unlock()
	switch {
	case on && !had:
		h.say(pass.Notice{Reason: pass.ReasonBrake, Message: fmt.Sprintf("paused by %s: %s", source, reason)})
	case !on && had:
		h.say(pass.Notice{Reason: pass.ReasonBrake, Message: fmt.Sprintf("the pause of %s lifted", source)})
	}
}

// loadBrakes puts the BrakeStore's brakes in force at start.
func (h *Hub) loadBrakes(ctx context.Context) error {
	if h.cfg.Brakes == nil {
		return nil
	}
	seq := h.BrakeSeq()
	b, err := h.cfg.Brakes.LoadBrakes(ctx)
	if err != nil {
		return fmt.Errorf("reading the operator's brakes (pause, suspend, detached machines): %w", err)
	}
	h.ApplyBrakes(seq, b)
	return nil
}

// DescribeBrakes says which brakes hold, for a log line or status.
func DescribeBrakes(bs []pass.Brake) string {
	parts := make([]string, len(bs))
	for i, b := range bs {
		parts[i] = b.String()
	}
	return strings.Join(parts, "; ")
}

// brakeFactsLocked fills in what the brakes and the last etcd recovery say: who paused the hub, whether
// it is suspended, the detached machines, the retired members. Called with h.mu held.
func (h *Hub) brakeFactsLocked(f *pass.Facts) {
	if h.isPaused() {
		f.Paused = DescribeBrakes(h.pausedBy())
	}
	f.Suspended, f.Detached, f.Retired = h.brakes.Suspended != nil, h.brakes.Detached, h.retired
}
