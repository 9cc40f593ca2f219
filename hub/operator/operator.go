// Package operator is the operator API's values: what `hub status`, `hub explain`, `hub reboot`,
// `hub recover` and the brakes send and receive (JSON over HTTP, on the hub's Unix socket or
// localhost with a token). The hub answers with them; the CLI, the metrics and Kubernetes mode read
// them.
package operator

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// Status is what `hub status` shows: the hub's brakes, the etcd budget and every machine.
type Status struct {
	Cluster string     `json:"cluster"`
	Time    time.Time  `json:"time"`
	Epoch   uint64     `json:"epoch"`
	Pause   PauseState `json:"pause"`
	// PausedBy lists every pause in force (any one holds): who, why, since when.
	PausedBy  []pass.Brake `json:"pausedBy,omitempty"`
	Suspended bool         `json:"suspended"`
	// Degraded says why the hub acts without the API server (Kubernetes mode's degraded mode), and
	// with what: empty when it does not.
	Degraded string `json:"degraded,omitempty"`
	// SuspendedBy says who made the hub observe-only, why and since when.
	SuspendedBy *pass.Brake `json:"suspendedBy,omitempty"`
	// NotPlanning says why the latest pass did not plan (agents disagree, suspended would-do, rate
	// limit); empty when it planned.
	NotPlanning string `json:"notPlanning,omitempty"`
	// Holding says what the latest pass would have started but held back (paused, suspended, rate
	// limit).
	Holding string         `json:"holding,omitempty"`
	Budget  *quorum.Budget `json:"budget,omitempty"`
	// QuorumLoss says which voters etcd's lost quorum lacks and whether they are lost for good (absent
	// while quorum holds).
	QuorumLoss *pass.QuorumLoss `json:"quorumLoss,omitempty"`
	// RaftMark is the highest raft index a member has reported to the hub (or the journal held when
	// the hub started): what a recovery after a permanent loss of quorum is checked against.
	RaftMark *pass.RaftMark `json:"raftMark,omitempty"`
	// Observers says how many of the expected observers the hub hears: it acts only on a strict
	// majority.
	Observers ObserversStatus `json:"observers"`
	// Policy is the policy in force.
	Policy   inventory.EffectivePolicy `json:"policy"`
	Machines []MachineStatus           `json:"machines"`
}

// ObserversStatus is the expected observer set as the hub hears it.
type ObserversStatus struct {
	Expected int      `json:"expected"`
	Heard    []string `json:"heard"`
	Missing  []string `json:"missing,omitempty"`
	Majority bool     `json:"majority"`
}

// MachineStatus is one machine's line of `hub status`.
type MachineStatus struct {
	Name   string `json:"name"`
	Node   string `json:"node"`
	Member string `json:"member,omitempty"`
	// Role: voter or learner in the membership the hub plans with, "absent" when the member is not in
	// it, empty for a machine that is not an etcd member.
	Role       string         `json:"role,omitempty"`
	EtcdHealth string         `json:"etcdHealth,omitempty"`
	Verdict    assess.Verdict `json:"verdict"`
	Since      time.Time      `json:"since,omitzero"`
	Reasons    []string       `json:"reasons,omitempty"`
	Detached   bool           `json:"detached,omitempty"`
	DetachedBy *pass.Brake    `json:"detachedBy,omitempty"`
	Decision   string         `json:"decision,omitempty"`
	// NeedsOperator: the hub will not heal this Unhealthy machine again by itself (given up, flapping,
	// fenced); Decision says what to do.
	NeedsOperator pass.OperatorNeed `json:"needsOperator,omitempty"`
	Remediation   *InFlight         `json:"remediation,omitempty"`
	// BMCLogin says why the hub makes no login to the machine's BMC now: its account refused the
	// credentials, and the hub waits before it tries again so that the account does not lock.
	BMCLogin string `json:"bmcLogin,omitempty"`
	// BMC is what the last readiness check of its BMC found (none yet, or no BMC: absent).
	BMC *pass.BMCReadiness `json:"bmc,omitempty"`
	// OutOfService, when set, says why its Node carries the out-of-service taint Hale put on
	// (Kubernetes mode, policy.outOfServiceAfter).
	OutOfService string `json:"outOfService,omitempty"`
	// PlannedWork, when set, is the planned work under way on it (policy.plannedWork: a cordon, a
	// rollout, a NodeMaintenance, a kubeadm upgrade): the hub starts nothing on it meanwhile, whatever
	// its verdict.
	PlannedWork string `json:"plannedWork,omitempty"`
}

// InFlight is a remediation in flight, as `hub status` shows it.
type InFlight struct {
	ID          string        `json:"id"`
	Strategy    string        `json:"strategy"`
	RequestedBy string        `json:"requestedBy"`
	Steps       []quorum.Step `json:"steps"`
	// Step is the index of the step under way (len(Steps) when all are done).
	Step int `json:"step"`
	// Busy: inside an irreversible step (a BMC call): a pause waits for it.
	Busy    bool `json:"busy"`
	Hard    bool `json:"hard,omitempty"`
	Forced  bool `json:"forced,omitempty"`
	Attempt int  `json:"attempt,omitempty"`
	// Stalled says why the remediation cannot go on right now: the journal refuses a write (retried
	// until it is in), or, resumed after a hub restart, it reads the BMC and the machine before
	// anything else. The machine stays in flight meanwhile.
	Stalled string `json:"stalled,omitempty"`
}

// Acting says whether the hub acts, for the observers line of `hub status`: only on a strict majority,
// and not while a brake or something else keeps it from starting anything.
func (st Status) Acting() string {
	switch {
	case !st.Observers.Majority:
		return "NOT a strict majority: acting on nothing"
	case st.Pause != Running:
		return "a strict majority, but " + strings.ToLower(string(st.Pause)) + ": nothing new starts"
	case st.Suspended:
		return "a strict majority, but suspended: observe-only"
	case st.NotPlanning != "":
		return "a strict majority, but not planning (below)"
	}
	return "a strict majority: acting"
}

// Explanation is why the hub does or does not act on one machine, from the same status `hub status`
// shows: `hub explain` prints it as text (String), and -o json|yaml as data.
type Explanation struct {
	// Time is when the status it is built from was taken.
	Time time.Time `json:"time"`
	// Machine is the machine's row of the status (verdict, evidence, etcd role, BMC readiness, the
	// remediation in flight).
	Machine MachineStatus `json:"machine"`
	// Strategy is how it is healed; BMC its BMC's endpoint (none: no BMC).
	Strategy string `json:"strategy"`
	BMC      string `json:"bmcEndpoint,omitempty"`
	// Planner is the planner's word on it.
	Planner string         `json:"planner"`
	Budget  *quorum.Budget `json:"budget,omitempty"`
	// Holding is the hold that keeps it, when one does.
	Holding string `json:"holding,omitempty"`
	// Lost is its part in a loss of etcd's quorum, when it is a lost voter.
	Lost *pass.LostVoter `json:"lostVoter,omitempty"`
	// Brakes are what keeps the hub from acting on it (pause, suspend, detach, a refused BMC login).
	Brakes []string `json:"brakes,omitempty"`
	// History is its last remediations (at most 5), oldest first, with every journaled step.
	History []journal.Remediation `json:"history,omitempty"`
	// Episodes are its last episodes (at most 10), oldest first: each stretch of time it was Unhealthy,
	// and whether it came back by itself.
	Episodes []pass.Episode `json:"episodes,omitempty"`
}

// String is the explanation as `hub explain` prints it.
func (e Explanation) String() string {
	ms := e.Machine
	var b strings.Builder
	fmt.Fprintf(&b, "%s (node %s", ms.Name, ms.Node)
	if ms.Member != "" {
		fmt.Fprintf(&b, ", etcd member %s: %s, %s", ms.Member, ms.Role, ms.EtcdHealth)
	}
	bmcEndpoint := e.BMC
	if bmcEndpoint == "" {
		bmcEndpoint = "none"
	}
	fmt.Fprintf(&b, "; strategy %s, BMC %s)\n", e.Strategy, bmcEndpoint)
	fmt.Fprintf(&b, "verdict: %s", ms.Verdict)
	if !ms.Since.IsZero() {
		fmt.Fprintf(&b, " since %s (%s ago)", ms.Since.Local().Format(time.TimeOnly), e.Time.Sub(ms.Since).Round(100*time.Millisecond))
	}
	b.WriteString("\n")
	for _, r := range ms.Reasons {
		fmt.Fprintf(&b, "  - %s\n", r)
	}
	if e.BMC != "" {
		b.WriteString(DescribeBMC(ms.BMC) + "\n")
	}
	fmt.Fprintf(&b, "planner: %s\n", e.Planner)
	if e.Budget != nil {
		fmt.Fprintf(&b, "budget: %s\n", e.Budget)
	}
	if l := e.Lost; l != nil {
		switch {
		case l.ForGood:
			fmt.Fprintf(&b, "quorum loss: %s is lost for good: %s\n", l.Member, l.Evidence)
		case l.PoweredOn:
			fmt.Fprintf(&b, "quorum loss: %s is lost, but its BMC reads the host powered on: it may be serving on the far side of a partition; silence is no proof\n", l.Member)
		default:
			fmt.Fprintf(&b, "quorum loss: %s is lost; nothing says yet that it will not come back\n", l.Member)
		}
	}
	if e.Holding != "" {
		fmt.Fprintf(&b, "holding: %s\n", e.Holding)
	}
	if len(e.Brakes) > 0 {
		fmt.Fprintf(&b, "brakes: %s\n", strings.Join(e.Brakes, "; "))
	}
	if r := ms.Remediation; r != nil {
		fmt.Fprintf(&b, "in flight: %s (%s, attempt %d, requested by %s), step %d of %d\n", r.ID, r.Strategy, r.Attempt, r.RequestedBy, r.Step+1, len(r.Steps))
		if r.Stalled != "" {
			fmt.Fprintf(&b, "  stalled: %s\n", r.Stalled)
		}
	}
	for _, ep := range e.Episodes {
		fmt.Fprintf(&b, "episode: %s\n", ep)
	}
	for _, rem := range e.History {
		fmt.Fprintf(&b, "remediation %s: %s, %s, requested by %s: %s\n", rem.ID, rem.State, rem.Strategy, rem.RequestedBy, rem.Reason)
		for _, ev := range rem.History {
			fmt.Fprintf(&b, "  %s %-7s %s\n", ev.At.Local().Format("15:04:05.000"), ev.Kind, ev.Detail)
		}
	}
	return b.String()
}

// DescribeBMC is explain's line on the last readiness check of a machine's BMC.
func DescribeBMC(r *pass.BMCReadiness) string {
	switch {
	case r == nil:
		return "bmc: not checked yet (the hub checks every BMC when it starts leading, then every 10 min)"
	case r.Ready:
		s := fmt.Sprintf("bmc: ready (power %s", r.Power)
		if r.Health != "" {
			s += ", health " + r.Health
		}
		s += fmt.Sprintf("), checked at %s", r.Checked.Local().Format(time.TimeOnly))
		for _, h := range r.Hangs {
			s += fmt.Sprintf("\n  event log: %s at %s (entry %s: %s)", h.Kind, h.At.Local().Format(time.TimeOnly), h.ID, h.Message)
		}
		if r.LogError != "" {
			s += "\n  event log not read: " + r.LogError + " (a hang is proved by the power alone)"
		}
		return s
	}
	return fmt.Sprintf("bmc: NOT READY (%s), checked at %s: %s", r.Problem, r.Checked.Local().Format(time.TimeOnly), r.Error)
}

// PauseState is what `hub status` says about pausing.
type PauseState string

// Pause states: Pausing lasts until every remediation in flight has reached a safe checkpoint.
const (
	Running PauseState = "Running"
	Pausing PauseState = "Pausing"
	Paused  PauseState = "Paused"
)

// RebootRequest is a manual reboot (`hub reboot MACHINE`).
type RebootRequest struct {
	Machine string `json:"machine"`
	// Hard: power-cycle at once instead of a graceful restart first.
	Hard bool `json:"hard,omitempty"`
	// DryRun: check and plan, change nothing.
	DryRun bool `json:"dryRun,omitempty"`
	// Force: go ahead when the quorum check refuses (or cannot be made); the refusal is journaled.
	Force bool `json:"force,omitempty"`
	// By names who asked, for the journal.
	By string `json:"by,omitempty"`
	// Adopt, when set, is the journal ID of a request object the operator created (Kubernetes mode:
	// a Remediation made with kubectl or `hub reboot --kubernetes`): the remediation is recorded in it.
	Adopt string `json:"-"`
	// OwnWay heals the machine its own way instead of a reboot: a replace by its owner when that is
	// its strategy (Cluster API's remediate-machine annotation asks for this).
	OwnWay bool `json:"-"`
}

// RebootResult says what a manual reboot did or would do.
type RebootResult struct {
	Steps []string `json:"steps"`
	// Remediation is the journal ID of the remediation started (empty for a dry run).
	Remediation string `json:"remediation,omitempty"`
	// Overrides is the refusal that --force overrode, if any.
	Overrides string `json:"overrides,omitempty"`
	DryRun    bool   `json:"dryRun,omitempty"`
}

// RecoverRequest is `hub recover --yes`: carry the recovery plan out, as far as the hub's part goes
// (pause, journal, fence). What the operator confirms clears what the hub cannot know by itself.
type RecoverRequest struct {
	// ConfirmLost are machines (or members) the operator confirms by name to be lost and off: a lost
	// voter whose BMC reads it powered on, one without evidence, one the hub cannot fence.
	ConfirmLost []string `json:"confirmLost,omitempty"`
	// AcceptDataLoss, when the survivor is behind the journaled raft mark, must name the gap exactly.
	AcceptDataLoss uint64 `json:"acceptDataLoss,omitempty"`
	By             string `json:"by,omitempty"`
}

// Confirms says whether the operator confirmed the machine (or its member) lost by name.
func (r RecoverRequest) Confirms(machine, member string) bool {
	return slices.Contains(r.ConfirmLost, machine) || slices.Contains(r.ConfirmLost, member)
}

// APIError is the body of an error answer.
type APIError struct {
	Error string `json:"error"`
}

// BrakeRequest is the optional body of pause, resume, suspend, unsuspend, detach and attach: who asks
// and why, for status and the record.
type BrakeRequest struct {
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
}
