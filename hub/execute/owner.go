package execute

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// Owner is the controller that owns a machine and replaces it its own way (Cluster API's
// KubeadmControlPlane or MachineSet, in Kubernetes mode). The hub hands the machine over once its
// quorum plan allows every membership step the owner will take, then waits for the owner to finish.
type Owner interface {
	// Describe names the owner and how it replaces, for the journal.
	Describe() string
	// HandOver signals the owner to replace the machine now, the way steps say (scale up first when
	// they begin with an add, delete first when with a remove). It is idempotent: after a hub restart
	// the hand-over may be signalled again.
	HandOver(ctx context.Context, reason string, steps []quorum.Step) error
	// Progress says where the owner stands: working, ready for the old machine to go (a scale-up-
	// first replacement whose new machine is ready: the hub then takes the plan's remove step through
	// Remove, journaled and re-checked like any other), or done (the old machine gone, its
	// replacement ready).
	Progress(ctx context.Context) (OwnerProgress, string, error)
	// Remove lets the old machine go once its replacement is ready. It is idempotent.
	Remove(ctx context.Context) error
	// Withdraw takes the hand-over back after the owner refused it (OwnerRefused), so that the owner
	// does not act later, outside any plan of the hub's. It is idempotent.
	Withdraw(ctx context.Context) error
}

// OwnerProgress is where an owner's replacement stands.
type OwnerProgress int

// Owner progress.
const (
	OwnerWorking OwnerProgress = iota
	OwnerReadyToRemove
	OwnerDone
	// OwnerRefused: the owner answered that it will not replace the machine (KubeadmControlPlane's
	// CannotBeRemediated: its retry limit, one replica, its own quorum check); Progress's text is its
	// answer. The hub withdraws the hand-over and ends the remediation Failed with that answer, instead
	// of waiting for its replace timeout.
	OwnerRefused
)

// handOver hands the machine to its owner for the plan's steps from i on: the owner removes and adds
// the members its own way, so every one of those steps is checked against the live membership first,
// in order (DESIGN.md rule 1), the intent written, the owner signalled, and its work awaited.
func (e *Executor) handOver(ctx context.Context, rem journal.Remediation, plan quorum.Plan, i int) error {
	rest := plan.Steps[i:]
	if handedOver(rem) { // resumed after the hand-over: the owner is at work
		if err := e.World.Gate(ctx); err != nil {
			return err
		}
		return e.awaitOwner(ctx, rem, plan)
	}
	var list []string
	for _, s := range rest {
		list = append(list, s.String())
	}
	err := e.take(ctx, rem, i, rest, fmt.Sprintf("hand over to %s: %s", e.Owner.Describe(), strings.Join(list, " → ")),
		func(ctx context.Context, _ int) (journal.Result, string, error) {
			return journal.ResultHandedOver, "handed over to " + e.Owner.Describe(), e.Owner.HandOver(ctx, rem.Reason, rest)
		})
	if err != nil {
		return err
	}
	return e.awaitOwner(ctx, rem, plan)
}

// handedOver: the owner was signalled (and so is at work).
func handedOver(rem journal.Remediation) bool { return rem.Has(journal.ResultHandedOver) }

// awaitOwner waits for the owner to have replaced the machine, and closes the plan. When the owner
// is ready for the old machine to go (scale up first), the plan's last step, the remove, is taken
// here: gate, re-check, intent, Remove, outcome.
func (e *Executor) awaitOwner(ctx context.Context, rem journal.Remediation, plan quorum.Plan) error {
	last := len(plan.Steps) - 1
	removed := rem.Has(journal.ResultOldRemoved)
	for {
		ready, refused := false, ""
		err := e.poll(ctx, rem, cmp.Or(e.ReplaceTimeout, time.Hour), func(ctx context.Context) (bool, string) {
			st, where, err := e.Owner.Progress(ctx)
			if err != nil {
				return false, err.Error()
			}
			ready = st == OwnerReadyToRemove && !removed
			if st == OwnerRefused {
				refused = where
			}
			return st == OwnerDone || ready || refused != "", where
		})
		if err != nil {
			return err
		}
		if refused != "" {
			return e.ownerRefused(ctx, rem, plan, refused)
		}
		if !ready {
			break
		}
		step := plan.Steps[last]
		err = e.take(ctx, rem, last, plan.Steps[last:], fmt.Sprintf("%s: the replacement is ready; %s lets the old machine go", step, e.Owner.Describe()),
			func(ctx context.Context, _ int) (journal.Result, string, error) {
				return journal.ResultOldRemoved, "old machine let go by " + e.Owner.Describe(), e.Owner.Remove(ctx)
			})
		if err != nil {
			return err
		}
		removed = true
	}
	if err := e.outcome(ctx, rem.ID, last, journal.ResultReplaced, "replaced by "+e.Owner.Describe()); err != nil {
		return err
	}
	return e.finish(ctx, rem.ID, journal.Succeeded, "every step done")
}

// ownerRefused ends a remediation whose owner refused the hand-over: the hand-over is withdrawn first
// (a refused hand-over left in place could be acted on later, outside the plan), then the hand-over
// step fails with the owner's answer.
func (e *Executor) ownerRefused(ctx context.Context, rem journal.Remediation, plan quorum.Plan, answer string) error {
	step := slices.IndexFunc(plan.Steps, func(s quorum.Step) bool { return s.Op.ChangesMembership() })
	err := fmt.Errorf("%s refused to replace %s: %s", e.Owner.Describe(), rem.Machine, answer)
	if werr := e.Owner.Withdraw(ctx); werr != nil {
		err = fmt.Errorf("%w; withdrawing the hand-over failed too (the owner may still act on it): %w", err, werr)
	}
	return e.stepFailed(ctx, rem, max(step, 0), plan.Steps[max(step, 0)], err)
}
