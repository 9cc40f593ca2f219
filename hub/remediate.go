package hub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// begin journals a new remediation and executes it (one word for the act: begin = journal + execute),
// for an operator's request: it returns once the journal has it (or refused it). detected is when the
// hub found the machine Unhealthy (zero for an operator's remediation).
func (h *Hub) begin(ctx context.Context, m pass.Machine, rem journal.Remediation, plan quorum.Plan, detected time.Time) (journal.Remediation, error) {
	r, rctx, ok := h.startFlight(ctx, m.Name, rem, plan, 0)
	if !ok {
		return rem, fmt.Errorf("%w: %s already has a remediation in flight (`hub explain %s`)", ErrRefused, m.Name, m.Name)
	}
	rem, act, err := h.journalBegin(rctx, m, rem, plan)
	if err != nil {
		h.endFlight(m.Name, r)
		return rem, err
	}
	h.execute(ctx, rctx, r, m, rem, plan, act, false, detected)
	return rem, nil
}

// beginQueued is the pass's begin: the remediation is in flight for the planner from now on, and it is
// journaled and executed beside the passes. In Kubernetes mode the journal is the API server, which,
// once etcd has lost quorum, answers a write only at the client's timeout: a pass held that long per
// begin left the leader, when its Lease ran out, with no view from after its last renewal, and it did
// not go on alone (found on the real kubeadm cluster, two of three nodes frozen). How the begin went is
// a fact of a later pass (advance, facts.begun), with the flight gone when it failed.
func (h *Hub) beginQueued(ctx context.Context, b pass.ToBegin) {
	r, rctx, ok := h.startFlight(ctx, b.Machine.Name, b.Remediation, b.Plan, 0)
	if !ok { // an operator's began since the pass read the flights
		h.advance.began(pass.BeginResult{Machine: b.Machine.Name, Err: errors.New("a remediation of it began meanwhile"), At: time.Now()})
		return
	}
	h.beginning.Add(1)
	go func() {
		defer h.beginning.Done()
		rem, act, err := h.journalBegin(rctx, b.Machine, b.Remediation, b.Plan)
		switch {
		case err == nil:
			h.execute(ctx, rctx, r, b.Machine, rem, b.Plan, act, false, b.Detected)
		case errors.Is(err, journal.ErrActive):
			err = h.adopt(ctx, rctx, r, b.Machine.Name, err)
		}
		// Told before the flight goes (and observe reads the flights before it takes what came
		// back): no pass sees a failed begin neither in flight nor failed, and begins it again.
		h.advance.began(pass.BeginResult{Machine: b.Machine.Name, Err: err, At: time.Now()})
		if err != nil {
			h.endFlight(b.Machine.Name, r)
		}
	}()
}

// journalBegin finds what carries a remediation out and journals its intent.
func (h *Hub) journalBegin(ctx context.Context, m pass.Machine, rem journal.Remediation, plan quorum.Plan) (journal.Remediation, actuator, error) {
	act, err := h.actuator(m, plan.Strategy)
	if err != nil {
		return rem, act, err
	}
	rem, err = h.cfg.Journal.Begin(ctx, rem)
	if err != nil {
		return rem, act, fmt.Errorf("the journal refused it: %w", err)
	}
	return rem, act, nil
}

// startFlight makes a remediation in flight (the planner counts it at once, status shows it once it is
// journaled) from step next, with the context that ends it; not when the machine has one in flight
// already (ok false: an operator's reboot checks, then begins, and a pass's begin may come between).
// One flight per machine: a flight put in another's place left that one running unseen, and a
// remediation found in progress with no flight of its machine is picked up (adopt).
func (h *Hub) startFlight(ctx context.Context, machine string, rem journal.Remediation, plan quorum.Plan, next int) (*running, context.Context, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, busy := h.running[machine]; busy {
		return nil, nil, false
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &running{rem: rem, plan: plan, next: next, cancel: cancel, since: time.Now()}
	h.running[machine] = r
	return r, rctx, true
}

// flightOf is the ID of machine's remediation in flight ("(being begun)" until it is journaled), and
// whether it has one.
func (h *Hub) flightOf(machine string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.running[machine]
	if !ok {
		return "", false
	}
	return cmp.Or(r.rem.ID, "(being begun)"), true
}

// endFlight ends r's flight (and its context), unless another has taken its place.
func (h *Hub) endFlight(machine string, r *running) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endFlightLocked(machine, r)
}

// endFlightLocked is endFlight with h.mu held.
func (h *Hub) endFlightLocked(machine string, r *running) {
	r.cancel()
	if h.running[machine] == r {
		delete(h.running, machine)
	}
}

// actuator is what carries out a machine's plan: its BMC, or for a replace its owner controller.
type actuator struct {
	power execute.Power
	owner execute.Owner
}

func (h *Hub) actuator(m pass.Machine, s quorum.Strategy) (actuator, error) {
	if s == quorum.Replace {
		owner, err := h.cfg.OwnerFor(m)
		return actuator{owner: owner}, err
	}
	power, err := h.cfg.PowerFor(m)
	if err != nil {
		return actuator{}, err
	}
	return actuator{power: h.guard(m, power)}, nil
}

// execute runs a remediation in its own goroutine: a new one from its first step, or one found in
// progress in the journal (resuming), which first finds out where it stands (Executor.Resume: the BMC
// and the machine are read before anything is repeated). Resuming runs there too, not before the
// passes: one machine's wait for evidence of a reset must not hold up every other machine.
func (h *Hub) execute(ctx, rctx context.Context, r *running, m pass.Machine, rem journal.Remediation, plan quorum.Plan, act actuator, resuming bool, detected time.Time) {
	h.mu.Lock()
	r.rem = rem // as journaled
	from := r.next
	h.mu.Unlock()
	how := rem.Strategy
	if rem.Hard {
		how += ", hard"
	}
	if rem.Forced {
		how += ", forced"
	}
	if !resuming {
		h.say(pass.Notice{Machine: m.Name, Reason: pass.ReasonRemediationStarted, Remediation: rem.ID,
			Message: fmt.Sprintf("%s: remediation %s started (%s, requested by %s): %s", m.Name, rem.ID, how, rem.RequestedBy, quorum.StepList(rem.Steps))})
	}
	policy := h.inventory().Policy
	w := &remediationWorld{h: h, m: m, rem: rem, r: r, detected: detected}
	exec := &execute.Executor{Journal: h.cfg.Journal, Policy: policy.Quorum, World: w, Log: h.log, ComeBackTimeout: policy.ComeBackTimeout,
		Hard: rem.Hard, Force: rem.Forced, Owner: act.owner, NotAMember: m.Member == "",
		ResetWindow: cmp.Or(h.cfg.BMC.GracefulTimeout, 2*time.Minute) + 30*time.Second}
	go func() {
		var err error
		if resuming {
			from, err = h.resumeAt(rctx, m, rem, plan, act, exec, r)
		}
		if err == nil {
			err = exec.Run(rctx, rem, plan, from, act.power)
		}
		h.mu.Lock()
		h.endFlightLocked(m.Name, r)
		stopping := ctx.Err() != nil
		h.mu.Unlock()
		w.ended(stopping, err)
	}()
}

// resumeAt finds where a remediation found in progress goes on (Executor.Resume). Until it knows, the
// remediation holds its machine: a BMC that cannot be read now (unreachable, refusing the
// credentials) is read again every resumeRetry, said once, and nothing is repeated on a guess.
func (h *Hub) resumeAt(ctx context.Context, m pass.Machine, rem journal.Remediation, plan quorum.Plan, act actuator, exec *execute.Executor, r *running) (int, error) {
	h.setStalled(r, fmt.Sprintf("resuming after a hub restart: reading the BMC and the machine before anything else (a reset sent without a recorded outcome may take up to %v to show)", exec.ResetWindow))
	defer h.setStalled(r, "")
	said := ""
	for {
		from, err := exec.Resume(ctx, rem, plan, act.power)
		if err == nil {
			h.say(pass.Notice{Machine: m.Name, Reason: pass.ReasonRemediationResumed, Remediation: rem.ID,
				Message: fmt.Sprintf("%s: resuming remediation %s at step %d after a restart", m.Name, rem.ID, from)})
			h.mu.Lock()
			r.next = from
			h.mu.Unlock()
			return from, nil
		}
		if ctx.Err() != nil || errors.Is(err, journal.ErrStaleEpoch) {
			return 0, err
		}
		if err.Error() != said {
			said = err.Error()
			h.setStalled(r, fmt.Sprintf("cannot resume yet: %v (trying again every %v; nothing is repeated without knowing)", err, resumeRetry))
			h.say(pass.Notice{Machine: m.Name, Reason: pass.ReasonResumeStalled, Remediation: rem.ID, Warning: true,
				Message: fmt.Sprintf("%s: remediation %s cannot resume yet: %v (trying again every %v)", m.Name, rem.ID, err, resumeRetry)})
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(resumeRetry):
		}
	}
}

const resumeRetry = 5 * time.Second

func (h *Hub) setStalled(r *running, why string) {
	h.mu.Lock()
	r.stalled = why
	h.mu.Unlock()
}

// resume picks up every remediation the journal says is in progress.
func (h *Hub) resume(ctx context.Context) error {
	active, err := h.cfg.Journal.Active(ctx)
	if err != nil {
		return err
	}
	for _, rem := range active {
		r, rctx, ok := h.startFlight(ctx, rem.Machine, rem, quorum.Plan{}, 0)
		if !ok {
			continue // the journal keeps one in progress per machine
		}
		if _, err := h.pickUp(ctx, rctx, r, rem); err != nil {
			return err
		}
	}
	return nil
}

// adopt carries on the remediation the journal holds in progress for machine, when this hub's begin
// of it (r, its flight) was refused for it (refused) and nothing here runs it: a begin whose journal
// write this hub saw fail while it went through (in Kubernetes mode, an API server that answered
// after the client's timeout, or created the Remediation and timed out writing its status) leaves a
// remediation in progress with nobody to carry it out, and every later begin of the machine refused
// for it (found on the real kubeadm cluster: a hung node never power-cycled). It is picked up as a
// restarted hub picks up what it finds (resume). It returns why the begin did not go on, or nil.
func (h *Hub) adopt(ctx, rctx context.Context, r *running, machine string, refused error) error {
	active, err := h.cfg.Journal.Active(rctx)
	if err != nil {
		return fmt.Errorf("%w; reading it: %w", refused, err)
	}
	h.mu.Lock()
	ours := h.running[machine] == r
	h.mu.Unlock()
	for _, rem := range active {
		if rem.Machine != machine || !ours {
			continue
		}
		h.log.Warn("a remediation in the journal that nothing here runs: picked up as after a restart", "machine", machine, "remediation", rem.ID)
		if carried, err := h.pickUp(ctx, rctx, r, rem); err != nil || !carried {
			return cmp.Or(err, fmt.Errorf("%w: ended, there was nothing to resume it with", refused))
		}
		return nil
	}
	return refused
}

// pickUp carries on rem, found in progress in the journal, with r (tracked for its machine): resumed
// where it stopped (the BMC and the machine read first), or ended Aborted when there is nothing to
// resume it with (carried false; its flight ended).
func (h *Hub) pickUp(ctx, rctx context.Context, r *running, rem journal.Remediation) (carried bool, err error) {
	m, ok := h.inventory().Machine(rem.Machine)
	why := "the machine is no longer in the inventory"
	plan, err := execute.PlanOf(rem)
	if err != nil {
		why = err.Error()
	}
	if !ok || err != nil {
		h.endFlight(rem.Machine, r)
		// Nothing to resume it with: ended Aborted, and said as the end of any remediation is.
		err := execute.WriteEntry(ctx, h.cfg.Journal, rem.ID, journal.Entry{Step: -1, Kind: journal.EntryNote, Ends: journal.Aborted, Detail: why}, nil)
		switch {
		case errors.Is(err, journal.ErrFinished):
		case err != nil:
			return false, fmt.Errorf("ending remediation %s (%s): %w", rem.ID, why, err)
		default:
			h.metrics.Remediation(rem, "failed")
			h.say(pass.Notice{Machine: rem.Machine, Reason: pass.ReasonRemediationFailed, Remediation: rem.ID, Warning: true,
				Message: fmt.Sprintf("%s: remediation %s ended Aborted, found in progress with nobody to carry it out: %s", rem.Machine, rem.ID, why)})
		}
		return false, nil
	}
	act, err := h.actuator(m, plan.Strategy)
	if err != nil {
		h.endFlight(m.Name, r)
		return false, fmt.Errorf("resuming %s: %w", rem.ID, err)
	}
	from := execute.NextStep(rem)
	if p, ok := rem.Pending(); ok {
		from = p.Step
	}
	h.mu.Lock()
	r.rem, r.plan, r.next = rem, plan, from
	h.mu.Unlock()
	h.execute(ctx, rctx, r, m, rem, plan, act, true, time.Time{})
	return true, nil
}
