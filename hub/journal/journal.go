// Package journal is what the hub keeps of its remediations, as values: one Remediation per operation
// on a machine, its history of entries (an intent before each side effect, its outcome after), and the
// Store the executor writes through (the standalone hub's is a bbolt file, package
// hub/journal/boltfile; Kubernetes mode keeps them in Remediation objects, package kube). It imports
// no I/O, so that the hub's pure packages read remediations without it, and knows nothing of how
// remediations are decided or carried out.
package journal

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/hale-dev/hale/quorum"
)

// State is where a remediation stands.
type State string

// Remediation states. Only InProgress is unfinished.
const (
	InProgress State = "InProgress"
	Succeeded  State = "Succeeded"
	Failed     State = "Failed"
	Aborted    State = "Aborted"
)

// EntryKind says what a journal entry records.
type EntryKind string

// Entry kinds: an intent is written before a side effect, its outcome after. An intent without an
// outcome after a crash means the side effect may or may not have happened: read the real state
// before repeating anything (DESIGN.md rule 4).
const (
	EntryIntent  EntryKind = "intent"
	EntryOutcome EntryKind = "outcome"
	EntryNote    EntryKind = "note"
)

// Result is what an outcome says happened, typed for the hub to read back (Detail is for people).
type Result string

// Outcome results.
const (
	// ResultDone: the step's side effect happened, verified (the BMC's power state, the member
	// healthy again).
	ResultDone Result = "Done"
	// ResultFailed: the side effect failed; the remediation ends Failed.
	ResultFailed Result = "Failed"
	// ResultHandedOver: the owner controller was signalled to replace the machine.
	ResultHandedOver Result = "HandedOver"
	// ResultOldRemoved: the owner let the old machine go, its replacement ready (scale up first).
	ResultOldRemoved Result = "OldRemoved"
	// ResultReplaced: the owner replaced the machine.
	ResultReplaced Result = "Replaced"
	// ResultNotRepeated: after a hub restart, the step's side effect shows it happened.
	ResultNotRepeated Result = "NotRepeated"
	// ResultRetaken: after a hub restart, the step evidently did not happen (or, for a hand-over,
	// may not have): it is taken again.
	ResultRetaken Result = "Retaken"
	// ResultWithdrawn: the step's request was not sent: by the time it would have gone out, the
	// machine was Healthy again or the step no longer passed the quorum check. The remediation ends
	// Aborted.
	ResultWithdrawn Result = "Withdrawn"
)

// Completes: the step is behind the remediation (the planner counts only the steps after it as
// still to come). A step retaken, handed over (the owner's steps are under way), failed or withdrawn
// is not.
func (r Result) Completes() bool {
	return r == ResultDone || r == ResultNotRepeated || r == ResultOldRemoved || r == ResultReplaced
}

// Announced: the hub says the outcome as a step done. A failed or withdrawn step is said by the
// remediation's end; a step's fate after a restart by the resume.
func (r Result) Announced() bool {
	return r == ResultDone || r == ResultHandedOver || r == ResultOldRemoved || r == ResultReplaced
}

// Entry is one line of a remediation's history: what the hub's executor writes and what the journal
// keeps.
type Entry struct {
	At   time.Time `json:"at"`
	Step int       `json:"step"`
	Kind EntryKind `json:"kind"`
	// Result is an outcome's (empty for an intent or a note).
	Result Result `json:"result,omitempty"`
	// Ends, on the note that ends the remediation, is the state it ends in.
	Ends   State  `json:"ends,omitempty"`
	Detail string `json:"detail"`
	Epoch  uint64 `json:"epoch"`
}

// Remediation is one persisted operation on one machine.
type Remediation struct {
	ID          string `json:"id"`
	Machine     string `json:"machine"`
	Strategy    string `json:"strategy"`
	RequestedBy string `json:"requestedBy"`
	Reason      string `json:"reason"`
	// Steps are the plan, each written as text ("power-cycle etcd-2"), read back typed.
	Steps []quorum.Step `json:"steps"`
	// Hard: power-cycle from the start (an escalation after a failed attempt, or `hub reboot --hard`).
	Hard bool `json:"hard,omitempty"`
	// Forced: an operator overrode the quorum check (`hub reboot --force`); the refusal is in History.
	Forced bool `json:"forced,omitempty"`
	// Attempt counts this machine's remediations since it was last healthy, this one included.
	Attempt int `json:"attempt,omitempty"`
	// WhileDead: the hub began it because the machine was dead to a majority of the observers (past
	// its stall tolerance, or on its BMC's proof of a hang): a sign of life before a disruptive
	// request goes out withdraws it (the machine resumed by itself).
	WhileDead bool `json:"whileDead,omitempty"`
	// AgentStarted is when the machine's agent had started, as last reported before the remediation
	// (zero: no report): the machine counts as back only with a report from an agent started later.
	AgentStarted time.Time `json:"agentStarted,omitzero"`
	// Members are the etcd members when it began: for a replace, the one that joins later is its
	// replacement (its steps name it with a placeholder: the owner picks the real name).
	Members []string  `json:"members,omitempty"`
	State   State     `json:"state"`
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
	History []Entry   `json:"history"`
}

// AgentRestarted says whether an agent that started at started is a later one than the one the
// remediation began with (AgentStarted), compared to the second: the Kubernetes journal keeps that
// time to the second (a metav1.Time), and compared to the nanosecond the agent that never restarted
// counted as a new one, so that a machine counted as back once it was no longer Unhealthy, while it
// was still rebooting (the real kubeadm cluster: "back" 50 ms after its power-on). A restarted agent
// starts seconds after the one before it at the least: its machine rebooted.
func (r Remediation) AgentRestarted(started time.Time) bool {
	return started.Truncate(time.Second).After(r.AgentStarted.Truncate(time.Second))
}

// Pending returns the last intent that has no outcome yet (ok false when there is none).
func (r Remediation) Pending() (Entry, bool) {
	for i := len(r.History) - 1; i >= 0; i-- {
		switch r.History[i].Kind {
		case EntryOutcome:
			return Entry{}, false
		case EntryIntent:
			return r.History[i], true
		}
	}
	return Entry{}, false
}

// Has says whether one of the remediation's outcomes has result res.
func (r Remediation) Has(res Result) bool {
	return slices.ContainsFunc(r.History, func(e Entry) bool { return e.Kind == EntryOutcome && e.Result == res })
}

// Store records remediations: intent before each side effect, outcome after. File (a bbolt file)
// is the standalone hub's; Kubernetes mode keeps them in Remediation objects. Every write fails with
// ErrStaleEpoch once a newer hub has taken over, and Begin with ErrActive when the machine already has
// a remediation in progress.
type Store interface {
	Begin(ctx context.Context, r Remediation) (Remediation, error)
	Intent(ctx context.Context, id string, step int, detail string) error
	Outcome(ctx context.Context, id string, step int, result Result, detail string) error
	Note(ctx context.Context, id string, detail string) error
	Finish(ctx context.Context, id string, state State, detail string) error
	Get(ctx context.Context, id string) (Remediation, error)
	// Active returns every remediation in progress, oldest first; History a machine's, oldest first.
	Active(ctx context.Context) ([]Remediation, error)
	History(ctx context.Context, machine string) ([]Remediation, error)
	// Epoch is this writer's epoch.
	Epoch() uint64
}

// Errors of the journal.
var (
	// ErrStaleEpoch: another hub opened the journal after this one; this one must not write.
	ErrStaleEpoch = errors.New("stale epoch: another hub took over the journal")
	// ErrActive: the machine already has a remediation in progress.
	ErrActive = errors.New("a remediation is already in progress")
	// ErrNoRemediation: no remediation has that ID.
	ErrNoRemediation = errors.New("no such remediation")
	// ErrFinished: the remediation is finished already; nothing more can be written to it.
	ErrFinished = errors.New("nothing more can be written to a finished remediation")
)
