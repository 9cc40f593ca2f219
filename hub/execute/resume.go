package execute

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// Resume decides where an unfinished remediation found in the journal goes on. A step whose intent has
// no outcome (the hub died in between) is not repeated blindly: the BMC is read first, and the step
// counts as done when the machine shows it (power off: Off; a reboot: LastResetTime after the intent,
// or the machine recovered already). Only a step that evidently did not happen is taken again, after
// the same quorum re-check as the first time.
func (e *Executor) Resume(ctx context.Context, rem journal.Remediation, plan quorum.Plan, power Power) (int, error) {
	pending, ok := rem.Pending()
	if !ok && handedOver(rem) {
		// The owner is at work: whatever step's outcome came last, go back to waiting for it (the
		// hand-over step finds the hand-over done and waits).
		for i, s := range plan.Steps {
			if s.Op.ChangesMembership() {
				return i, nil
			}
		}
	}
	if !ok {
		return NextStep(rem), nil
	}
	step := plan.Steps[pending.Step]
	if step.Op.ChangesMembership() {
		// A hand-over to the owner is idempotent: signalled again, it changes nothing already done.
		if err := e.outcome(ctx, rem.ID, pending.Step, journal.ResultRetaken, "after a hub restart: the owner may not have been signalled: signalling it again (idempotent)"); err != nil {
			return 0, err
		}
		return pending.Step, nil
	}
	st, lastReset, err := power.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("resuming %s: reading the BMC before anything else: %w", rem.ID, err)
	}
	done := false
	var why string
	switch {
	case step.Op == quorum.OpPowerOff:
		done, why = st == bmc.PowerOff, fmt.Sprintf("the BMC reports %s", st)
	case !lastReset.IsZero() && lastReset.After(pending.At):
		done, why = st == bmc.PowerOn, fmt.Sprintf("the BMC reports %s, last reset at %s, after the intent", st, lastReset.Format(time.RFC3339Nano))
	case e.World.CameBack(ctx):
		done, why = true, "the machine is back already"
	case lastReset.IsZero():
		done, why = e.awaitReset(ctx, pending.At, power)
	default:
		why = fmt.Sprintf("the BMC reports %s and no reset since the intent", st)
	}
	if done {
		if err := e.outcome(ctx, rem.ID, pending.Step, journal.ResultNotRepeated, "after a hub restart: "+why+": not repeated"); err != nil {
			return 0, err
		}
		return pending.Step + 1, nil
	}
	if err := e.outcome(ctx, rem.ID, pending.Step, journal.ResultRetaken, "after a hub restart: "+why+": the step did not happen; taking it again"); err != nil {
		return 0, err
	}
	return pending.Step, nil
}

// awaitReset decides, for a BMC that keeps no reset time, whether a reset sent at intent happened:
// yes as soon as the BMC reports Off, the machine shows it (ResetEvidence) or is back; no once
// ResetWindow has passed since the intent without any of these (the machine stayed up with the same
// agent all along). Sending it again on a guess would reset a machine twice.
func (e *Executor) awaitReset(ctx context.Context, intent time.Time, power Power) (bool, string) {
	interval := e.pollInterval()
	deadline := intent.Add(cmp.Or(e.ResetWindow, 2*time.Minute+30*time.Second))
	for {
		if st, _, err := power.Status(ctx); err == nil && st == bmc.PowerOff {
			return true, "the BMC keeps no reset time, but reports Off: the reset is under way"
		}
		if ok, why := e.World.ResetEvidence(ctx, intent); ok {
			return true, "the BMC keeps no reset time, but " + why
		}
		if e.World.CameBack(ctx) {
			return true, "the BMC keeps no reset time, but the machine is back already"
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false, fmt.Sprintf("the BMC keeps no reset time, and in %v since the intent the machine showed no sign of one "+
				"(its agent did not restart, nobody saw it go down)", time.Since(intent).Round(time.Second))
		}
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
}

// NextStep is the step after the last one with an outcome.
func NextStep(rem journal.Remediation) int {
	next := 0
	for _, ev := range rem.History {
		if ev.Kind == journal.EntryOutcome && ev.Step+1 > next {
			next = ev.Step + 1
		}
	}
	return next
}

// PlanOf rebuilds a remediation's plan from its journal record.
func PlanOf(rem journal.Remediation) (quorum.Plan, error) {
	s, err := quorum.ParseStrategy(rem.Strategy)
	if err != nil {
		return quorum.Plan{}, fmt.Errorf("remediation %s: %w", rem.ID, err)
	}
	if len(rem.Steps) == 0 {
		return quorum.Plan{}, fmt.Errorf("remediation %s: no readable steps in its record (see its history)", rem.ID)
	}
	return quorum.Plan{Strategy: s, Member: rem.Steps[0].Member, Steps: slices.Clone(rem.Steps)}, nil
}
