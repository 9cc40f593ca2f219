package hub

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/hale-dev/hale/quorum"
)

// Errors of the operator controls, for the API to map to a status.
var (
	// ErrNotFound: the machine is not in the inventory.
	ErrNotFound = errors.New("not in the inventory")
	// ErrRefused: the request is understood and unsafe or not allowed now; the message says why.
	ErrRefused = errors.New("refused")
)

// PauseState is what `hub status` says about pausing.
type PauseState string

// Pause states: Pausing lasts until every remediation in flight has reached a safe checkpoint.
const (
	Running PauseState = "Running"
	Pausing PauseState = "Pausing"
	Paused  PauseState = "Paused"
)

// PauseState says whether the pause is acknowledged: Paused only once no remediation is inside an
// irreversible step.
func (h *Hub) PauseState() PauseState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pauseState()
}

func (h *Hub) pauseState() PauseState {
	switch {
	case !h.isPaused():
		return Running
	case h.busy(""):
		return Pausing
	}
	return Paused
}

// busy says whether a remediation (of machine, when set) is inside an irreversible step: between a
// checkpoint and the step's outcome. Callers hold h.mu.
func (h *Hub) busy(machine string) bool {
	for _, r := range h.running {
		if r.busy && (machine == "" || r.rem.Machine == machine) {
			return true
		}
	}
	return false
}

// settled waits, up to settleWait, until no remediation (of machine, when set) is inside an
// irreversible step: a suspend or a detach asked over the API answers once nothing it holds is still
// being carried out, as a pause is acknowledged (Paused). A step past its checkpoint when the brake
// came completes (a BMC request cannot be called back; test/chaos seed 1 under load: an IPMI cycle's
// power-off went out 0.1 s after `hub suspend` returned).
func (h *Hub) settled(ctx context.Context, machine string) {
	deadline := time.Now().Add(settleWait)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		busy := h.busy(machine)
		h.mu.Unlock()
		if !busy {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// settleWait bounds settled: a step longer than this (a BMC call stuck) shows as busy in the status
// the command returns.
const settleWait = 2 * time.Minute

// SetInventory puts a reloaded inventory in force. The gossip cluster cannot change without a
// restart; remediations in flight go on with the machine as they started with it.
func (h *Hub) SetInventory(inv Inventory) error {
	h.mu.Lock()
	if inv.Cluster != h.inv.Cluster {
		h.mu.Unlock()
		return fmt.Errorf("cluster: %q → %q needs a restart of the hub (it names the gossip pool); keeping the previous inventory", h.inv.Cluster, inv.Cluster)
	}
	same, sameBMCs := reflect.DeepEqual(h.inv, inv), slices.EqualFunc(h.inv.Machines, inv.Machines, sameBMC)
	h.inv = inv
	h.mu.Unlock()
	if !same {
		h.say(Notice{Reason: ReasonInventoryReloaded, Message: fmt.Sprintf("inventory reloaded: %d machines", len(inv.Machines))})
	}
	if !sameBMCs {
		h.askBMCCheck() // a corrected address or login shows at once, not at the next check
	}
	return nil
}

// sameBMC says whether a and b are the same machine behind the same BMC, reached the same way.
func sameBMC(a, b Machine) bool {
	return a.Name == b.Name && a.Endpoint == b.Endpoint && a.Credentials == b.Credentials && a.CAFile == b.CAFile && a.Insecure == b.Insecure
}

// askBMCCheck asks the BMC readiness checks (watchBMCs) for one now; one asked already will do.
func (h *Hub) askBMCCheck() {
	select {
	case h.checkBMCs <- struct{}{}:
	default:
	}
}

// gate is the executors' checkpoint: it marks the remediation busy for the step that follows, or
// holds it while the hub is paused or suspended.
func (h *Hub) gate(machine string, overtaken func() error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		for {
			if overtaken() != nil {
				return nil // it goes no further: the executor ends it (take)
			}
			h.mu.Lock()
			r := h.running[machine]
			if r != nil {
				r.busy = false
			}
			if !h.stepsHeld() {
				if r != nil {
					r.busy = true
				}
				h.mu.Unlock()
				return nil
			}
			wait := h.resumed
			h.mu.Unlock()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-wait:
			}
		}
	}
}

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

// Reboot reboots a machine on an operator's request, through the same quorum check and journal as the
// hub's own remediations. Refusals wrap ErrRefused and say why and what to do.
func (h *Hub) Reboot(ctx context.Context, req RebootRequest) (RebootResult, error) {
	inv := h.inventory()
	m, ok := inv.Machine(req.Machine)
	if !ok {
		return RebootResult{}, fmt.Errorf("machine %q: %w", req.Machine, ErrNotFound)
	}
	h.mu.Lock()
	paused, suspended := h.isPaused(), h.brakes.Suspended != nil
	_, detached := h.brakes.Detached[m.Name]
	r, inFlight := h.running[m.Name]
	h.mu.Unlock()
	switch why := h.standby(); {
	case why != "" && !req.DryRun:
		return RebootResult{}, fmt.Errorf("%w: %s", ErrRefused, why)
	case inFlight:
		return RebootResult{}, fmt.Errorf("%w: %s already has remediation %s in flight (`hub explain %s`)", ErrRefused, m.Name, r.rem.ID, m.Name)
	case detached && !req.DryRun:
		return RebootResult{}, fmt.Errorf("%w: %s is detached: no BMC call for it until `hub attach %s`", ErrRefused, m.Name, m.Name)
	case paused && !req.DryRun:
		h.mu.Lock()
		why := DescribeBrakes(h.pausedBy())
		h.mu.Unlock()
		return RebootResult{}, fmt.Errorf("%w: the hub is paused (%s): nothing starts until the pause is lifted", ErrRefused, why)
	case suspended && !req.DryRun:
		return RebootResult{}, fmt.Errorf("%w: the hub is suspended (observe-only): use --dry-run to see the plan, or `hub unsuspend`", ErrRefused)
	case m.Hold != "" && !req.DryRun:
		return RebootResult{}, fmt.Errorf("%w: %s: %s", ErrRefused, m.Name, m.Hold)
	}
	if why := h.logins.blocked(m, time.Now()); why != "" && !req.DryRun && !(req.OwnWay && m.Strategy == quorum.Replace) {
		return RebootResult{}, fmt.Errorf("%w: %s: %s", ErrRefused, m.Name, why)
	}
	// Never forced: the old cluster's quorum running again is two etcds.
	retired, err := h.oldQuorumIfOn(ctx, m.Name)
	if err != nil {
		return RebootResult{}, err
	}
	strategy := quorum.Reboot
	if req.OwnWay && m.Strategy == quorum.Replace {
		strategy = quorum.Replace
	}
	if strategy == quorum.Replace && req.Force {
		return RebootResult{}, fmt.Errorf("%w: %s: a replace is never forced over the quorum check", ErrRefused, m.Name)
	}
	plan, refusal := machinePlan(strategy, m), error(nil)
	if m.Member != "" {
		live, err := h.live(ctx)
		if err == nil {
			opts := m.Replace
			opts.NewMember = m.Member + newMemberSuffix
			plan, err = live.PlanBeside(inv.Policy.Quorum, quorum.Machine{Name: m.Name, Member: m.Member, Strategy: strategy, Replace: opts}, h.inFlight(inv))
			// The pass's hold on a member that runs while quorum is lost holds an operator too: the
			// quorum check counts such a member down ("no leader"), and its reboot free.
			if hd, held := h.runningMemberHold(m, live, inv); held {
				refusal = errors.New(hd.why)
			}
		} else {
			err = fmt.Errorf("cannot check quorum: %w", err)
		}
		if err != nil {
			plan, refusal = quorum.Plan{Strategy: quorum.Reboot, Member: m.Member,
				Steps: []quorum.Step{{Op: quorum.OpPowerCycle, Member: m.Member}, {Op: quorum.OpAwaitHealthy, Member: m.Member}}}, andRefused(refusal, err.Error())
		}
	}
	h.mu.Lock()
	last := h.retired
	h.mu.Unlock()
	if _, survivor := last.survivorHold(m.Name); survivor {
		refusal = andRefused(refusal, fmt.Sprintf("%s is the survivor etcd recovery %s rebuilt the cluster from, and a majority of the observers has not reached the rebuilt cluster "+
			"since: %s holds the only copy of its data, and a boot that fails now loses the cluster", m.Name, last.token, last.survivor.member))
	}
	res := RebootResult{Steps: plan.StepStrings(), DryRun: req.DryRun}
	if refusal != nil {
		switch {
		case retired && !req.Force:
			return res, fmt.Errorf("%w: %s of %s: %v: retired by the last etcd recovery, it is in the new cluster's membership no longer, so powering it on costs "+
				"that cluster nothing: --force powers it on; then run `agent rejoin` on it", ErrRefused, strategy, m.Name, refusal)
		case !req.Force:
			return res, fmt.Errorf("%w: %s of %s: %v (--force overrides this for a reboot; you would be acting against quorum)", ErrRefused, strategy, m.Name, refusal)
		}
		res.Overrides = refusal.Error()
	}
	if req.DryRun {
		return res, nil
	}
	by := req.By
	if by == "" {
		by = "operator"
	}
	rem := Remediation{ID: req.Adopt, Machine: m.Name, Strategy: strategy.String(), RequestedBy: by, Reason: "manual " + strategy.String(),
		Steps: plan.Steps, Hard: req.Hard, Forced: refusal != nil, Attempt: 1}
	if refusal != nil {
		rem.Reason += "; forced over: " + refusal.Error()
	}
	if r, ok := h.cfg.Gossip.Reports()[m.Node]; ok {
		rem.AgentStarted = r.Started
	}
	// A manual remediation outlives the request that started it: it stops with the hub, not the caller.
	h.mu.Lock()
	hubCtx := h.ctx
	for _, mb := range h.view.cluster.Members {
		rem.Members = append(rem.Members, mb.Name)
	}
	h.mu.Unlock()
	if hubCtx == nil {
		return res, fmt.Errorf("%w: the hub is not running yet", ErrRefused)
	}
	rem, err = h.begin(hubCtx, m, rem, plan, time.Time{})
	if err != nil {
		return res, err
	}
	res.Remediation = rem.ID
	return res, nil
}

// andRefused adds why to a reboot's refusal (nil: none yet), the newest first.
func andRefused(refusal error, why string) error {
	if refusal != nil {
		why += "; and " + refusal.Error()
	}
	return errors.New(why)
}

// runningMemberHold is the pass's hold on a machine whose member runs while etcd has lost quorum
// (answersHold), judged for an operator's reboot on the latest pass's assessments and cluster, the
// live membership.
func (h *Hub) runningMemberHold(m Machine, cluster quorum.Cluster, inv Inventory) (hold, bool) {
	h.mu.Lock()
	f := facts{inv: inv, assessments: h.view.assessments}
	h.mu.Unlock()
	return answersHold(f, m, assessmentOf(f.assessments, -1, m.Name), cluster.Budget(inv.Policy.Quorum).QuorumLost(), silentVoters(f, cluster))
}
