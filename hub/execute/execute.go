// Package execute carries out one remediation, step by step, through the interfaces it owns (World,
// Power, Owner): each irreversible step journaled as an intent before and an outcome after, and a
// remediation found in progress resumed where it stood, the BMC read before anything is repeated.
package execute

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// Power is what the executor needs of a machine's BMC (bmc.Controller has it).
type Power interface {
	Status(ctx context.Context) (bmc.PowerState, time.Time, error)
	Reboot(ctx context.Context) (bmc.Result, error)
	PowerCycle(ctx context.Context) (bmc.Result, error)
	ForceOff(ctx context.Context) (bmc.Result, error)
}

// World is the world a remediation acts in, as its executor reads and tells it: one per remediation
// (the hub's is remediationWorld, world.go). Every irreversible step is checked against it just before
// it is taken (DESIGN.md rule 1), and everything the executor records goes back through Recorded.
type World interface {
	// Live is the etcd membership as it is now, other remediations in flight marked InFlight.
	Live(ctx context.Context) (quorum.Cluster, error)
	// Barrier waits until the observers have reported again: a step that costs budget (disrupts a
	// healthy voter) is checked once more after it, against what they see now, not against reports
	// a partition may have cut off seconds ago.
	Barrier(ctx context.Context) error
	// Gate is the safe checkpoint before every irreversible step: it blocks while the hub is paused
	// and returns an error when the remediation must stop.
	Gate(ctx context.Context) error
	// Wanted says (nil) that the remediation is still wanted: for the hub's own, that the machine has
	// not been judged Healthy again. It is asked, with the quorum check, just before each disruptive
	// BMC request goes out (bmc.WithCheck), which can be seconds after the step began.
	Wanted() error
	// Overtaken says (nil) that nothing has taken the machine out of the cluster the remediation was
	// begun for: an etcd recovery begun since retires it (retired.go). It is asked with Wanted, and
	// while a step awaits the machine's recovery.
	Overtaken() error
	// CameBack says whether the machine is back: its agent restarted and in the gossip pool, and for
	// an etcd member, the member healthy again. The BMC saying "On" is not enough.
	CameBack(ctx context.Context) bool
	// ResetEvidence says whether the machine shows, other than through its BMC, that it was reset
	// after since (its agent restarted, observers saw it go down): what Resume goes by when the BMC
	// keeps no reset time (IPMI, metal3, some Redfish firmware).
	ResetEvidence(ctx context.Context, since time.Time) (bool, string)
	// Recorded is told every entry once the journal has it, in order: the one value the notice and
	// the metric are derived from. A write the journal refuses is told with its error (once; the
	// executor retries it until it is in, then tells the entry).
	Recorded(en journal.Entry, err error)
}

// Executor carries out one remediation's plan, step by step, with the journal written before and
// after every side effect.
type Executor struct {
	Journal      journal.Store
	Policy       quorum.Policy
	World        World
	Log          *slog.Logger
	PollInterval time.Duration
	// ComeBackTimeout bounds an await-healthy step (default 10 min).
	ComeBackTimeout time.Duration
	// ReplaceTimeout bounds the wait for an owner's replacement, which provisions a machine (default
	// 60 min: bare metal takes long to provision).
	ReplaceTimeout time.Duration
	// Hard makes a reboot a hard power cycle from the start (`hub reboot --hard`, or an escalation).
	Hard bool
	// Force: the operator overrode the quorum check; a refusal is written to the journal, not obeyed.
	Force bool
	// Owner, when set, carries out a plan's membership steps (a replace): without one they are refused.
	Owner Owner
	// NotAMember: the machine runs no etcd member, so there is no quorum to re-check (its pool's
	// limits were applied when it was started).
	NotAMember bool
	// ResetWindow bounds, from the intent, how long Resume waits for evidence of a reset (World.
	// ResetEvidence) before it takes the step again: as long as a reset may take to show (a graceful
	// restart, then the hard one).
	ResetWindow time.Duration
	// LiveWait bounds how long the quorum re-check, and the check just before each disruptive BMC
	// request, wait for a membership they cannot know now (too few observers report it: an etcd
	// election, a hub just restarted, a loaded machine), or one on which the step is refused, before
	// the remediation ends Aborted (default 10 s).
	LiveWait time.Duration
}

// record writes one entry to the journal, retried until it is in (Persist), and tells the world.
// A finish of a remediation finished already is done.
func (e *Executor) record(ctx context.Context, id string, en journal.Entry) error {
	err := WriteEntry(ctx, e.Journal, id, en, e.World.Recorded)
	if errors.Is(err, journal.ErrFinished) && en.Ends != "" {
		return nil
	}
	return err
}

// WriteEntry is the one door through which the hub writes to a remediation begun in the journal
// (Hub.begin begins it): every intent, outcome, note and end, retried until the journal accepts it
// (Persist). told, when set, hears of the first refusal and of the write accepted. TestOneDoor
// holds that no other code writes them.
func WriteEntry(ctx context.Context, j journal.Store, id string, en journal.Entry, told func(journal.Entry, error)) error {
	var refused func(error)
	if told != nil {
		refused = func(err error) { told(en, err) }
	}
	err := Persist(ctx, refused, func(ctx context.Context) error {
		switch {
		case en.Ends != "":
			return j.Finish(ctx, id, en.Ends, en.Detail)
		case en.Kind == journal.EntryIntent:
			return j.Intent(ctx, id, en.Step, en.Detail)
		case en.Kind == journal.EntryOutcome:
			return j.Outcome(ctx, id, en.Step, en.Result, en.Detail)
		}
		return j.Note(ctx, id, en.Detail)
	})
	if err == nil && told != nil {
		told(en, nil)
	}
	return err
}

func (e *Executor) intent(ctx context.Context, id string, i int, detail string) error {
	return e.record(ctx, id, journal.Entry{Kind: journal.EntryIntent, Step: i, Detail: detail})
}

func (e *Executor) outcome(ctx context.Context, id string, i int, result journal.Result, detail string) error {
	return e.record(ctx, id, journal.Entry{Kind: journal.EntryOutcome, Step: i, Result: result, Detail: detail})
}

func (e *Executor) note(ctx context.Context, id string, detail string) error {
	return e.record(ctx, id, journal.Entry{Step: -1, Kind: journal.EntryNote, Detail: detail})
}

func (e *Executor) finish(ctx context.Context, id string, state journal.State, detail string) error {
	return e.record(ctx, id, journal.Entry{Step: -1, Kind: journal.EntryNote, Ends: state, Detail: detail})
}

// Run executes plan for remediation rem (begun in the journal) from step from on; Resume finds from.
func (e *Executor) Run(ctx context.Context, rem journal.Remediation, plan quorum.Plan, from int, power Power) error {
	for i := from; i < len(plan.Steps); i++ {
		step := plan.Steps[i]
		switch step.Op {
		case quorum.OpPowerCycle, quorum.OpPowerOff:
			err := e.take(ctx, rem, i, plan.Steps[i:i+1], e.describe(step), func(ctx context.Context, cost int) (journal.Result, string, error) {
				res, err := e.act(bmc.WithCheck(ctx, e.stillSafe(step, cost)), step, power)
				return journal.ResultDone, fmt.Sprintf("%s: %s (sent %s)", res.After, res.Evidence, strings.Join(res.Requests, ", ")), err
			})
			if err != nil {
				return err
			}
		case quorum.OpAwaitHealthy:
			if err := e.await(ctx, rem, i, step); err != nil {
				return err
			}
		default:
			if e.Owner == nil {
				err := fmt.Errorf("step %v: membership changes are the owner controller's (Kubernetes mode), not the standalone hub's", step)
				return errors.Join(err, e.finish(ctx, rem.ID, journal.Aborted, err.Error()))
			}
			return e.handOver(ctx, rem, plan, i)
		}
	}
	return e.finish(ctx, rem.ID, journal.Succeeded, "every step done")
}

// take is the one sequence of an irreversible step: the gate (a safe checkpoint: it holds while the
// hub is paused), the quorum re-check of steps (the step itself, or for a hand-over every step the
// owner will take, in order) against the live membership, the intent, the side effect (act, given
// how far the steps take the fault tolerance down), and its outcome. A side effect withdrawn just
// before its request went out (bmc.ErrWithdrawn) ends the remediation Aborted; one that failed,
// Failed.
func (e *Executor) take(ctx context.Context, rem journal.Remediation, i int, steps []quorum.Step, intent string,
	act func(ctx context.Context, cost int) (journal.Result, string, error)) error {
	if err := e.World.Gate(ctx); err != nil {
		return err
	}
	if err := e.World.Overtaken(); err != nil {
		return errors.Join(err, e.finish(ctx, rem.ID, journal.Aborted, err.Error()))
	}
	cost, err := e.recheck(ctx, rem, steps...)
	if err != nil {
		return err
	}
	if err := e.intent(ctx, rem.ID, i, intent); err != nil {
		return err
	}
	result, outcome, err := act(ctx, cost)
	switch {
	case errors.Is(err, bmc.ErrWithdrawn) && ctx.Err() == nil:
		return e.withdrawn(ctx, rem, i, steps[0], err)
	case err != nil:
		return e.stepFailed(ctx, rem, i, steps[0], err)
	}
	return e.outcome(ctx, rem.ID, i, result, outcome)
}

// stepFailed records that step i's side effect failed and ends the remediation Failed. When the hub
// is stopping in the middle of the call, whether it acted is unknown: the intent stays pending and
// the next hub reads the world before doing anything.
func (e *Executor) stepFailed(ctx context.Context, rem journal.Remediation, i int, step quorum.Step, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if werr := e.outcome(ctx, rem.ID, i, journal.ResultFailed, "failed: "+err.Error()); werr != nil {
		return errors.Join(err, werr)
	}
	return errors.Join(err, e.finish(ctx, rem.ID, journal.Failed, err.Error()))
}

// withdrawn records that step i's request was not sent, because what made it wanted or safe no
// longer held when it would have gone out, and ends the remediation Aborted: the next pass decides
// afresh (a machine that is Healthy again is left alone).
func (e *Executor) withdrawn(ctx context.Context, rem journal.Remediation, i int, step quorum.Step, err error) error {
	if werr := e.outcome(ctx, rem.ID, i, journal.ResultWithdrawn, err.Error()); werr != nil {
		return errors.Join(err, werr)
	}
	return errors.Join(err, e.finish(ctx, rem.ID, journal.Aborted, err.Error()))
}

func (e *Executor) describe(step quorum.Step) string {
	if step.Op == quorum.OpPowerOff {
		return "power off " + step.Member + " (fence)"
	}
	if e.Hard {
		return "power-cycle " + step.Member + " (hard)"
	}
	return "reboot " + step.Member + " (graceful, then hard)"
}

func (e *Executor) act(ctx context.Context, step quorum.Step, power Power) (bmc.Result, error) {
	switch {
	case step.Op == quorum.OpPowerOff:
		return power.ForceOff(ctx)
	case e.Hard:
		return power.PowerCycle(ctx)
	}
	return power.Reboot(ctx)
}

func (e *Executor) await(ctx context.Context, rem journal.Remediation, i int, step quorum.Step) error {
	err := e.poll(ctx, rem, cmp.Or(e.ComeBackTimeout, 10*time.Minute), func(ctx context.Context) (bool, string) {
		return e.World.CameBack(ctx), "agent in the pool, member healthy"
	})
	if err != nil {
		return err
	}
	return e.outcome(ctx, rem.ID, i, journal.ResultDone, "back: agent in the pool, member healthy")
}

// pollInterval is how often a wait asks again (PollInterval; 250 ms when unset).
func (e *Executor) pollInterval() time.Duration {
	if e.PollInterval <= 0 {
		return 250 * time.Millisecond
	}
	return e.PollInterval
}

// poll waits until done says so, for at most timeout; at the deadline the remediation fails with what
// done last said.
func (e *Executor) poll(ctx context.Context, rem journal.Remediation, timeout time.Duration, done func(context.Context) (bool, string)) error {
	interval := e.pollInterval()
	deadline := time.Now().Add(timeout)
	for {
		ok, where := done(ctx)
		if ok {
			return nil
		}
		if err := e.World.Overtaken(); err != nil {
			return errors.Join(err, e.finish(ctx, rem.ID, journal.Aborted, err.Error()))
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("%s did not come back within %v (%s)", rem.Machine, timeout, where)
			return errors.Join(err, e.finish(ctx, rem.ID, journal.Failed, err.Error()))
		}
		select {
		case <-ctx.Done():
			return ctx.Err() // the hub is stopping: the journal still says InProgress, to resume
		case <-time.After(interval):
		}
	}
}

// journalRetryMax bounds the wait between two attempts at a journal write.
const journalRetryMax = 5 * time.Second

// Persist makes write, retrying until the journal accepts it: a remediation whose outcome or end is
// not recorded would stay in progress in the journal and block its machine, so it keeps running (and
// holding its machine) until the write is in. refused is told the first failure. It gives up only when no retry can succeed: another hub took over the journal
// (ErrStaleEpoch), the remediation was finished already (journal.ErrFinished), or ctx ended (the hub is
// stopping; the journal still says in progress and the next hub resumes from what it recorded).
func Persist(ctx context.Context, refused func(error), write func(context.Context) error) error {
	wait := 250 * time.Millisecond
	failed := false
	for {
		err := write(ctx)
		if err == nil || errors.Is(err, journal.ErrStaleEpoch) || errors.Is(err, journal.ErrFinished) || ctx.Err() != nil {
			return err
		}
		if !failed && refused != nil {
			refused(err)
		}
		failed = true
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (the hub stopped before the journal accepted it: %w)", err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, journalRetryMax)
	}
}
