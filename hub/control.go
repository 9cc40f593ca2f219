package hub

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// Errors of the operator controls, for the API to map to a status.
var (
	// ErrNotFound: the machine is not in the inventory.
	ErrNotFound = errors.New("not in the inventory")
	// ErrRefused: the request is understood and unsafe or not allowed now; the message says why.
	ErrRefused = pass.ErrRefused
)

// operator.PauseState says whether the pause is acknowledged: operator.Paused only once no remediation is inside an
// irreversible step.
func (h *Hub) PauseState() operator.PauseState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pauseState()
}

func (h *Hub) pauseState() operator.PauseState {
	switch {
	case !h.isPaused():
		return operator.Running
	case h.busy(""):
		return operator.Pausing
	}
	return operator.Paused
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
// being carried out, as a pause is acknowledged (operator.Paused). A step past its checkpoint when the brake
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
func (h *Hub) SetInventory(inv pass.Inventory) error {
	h.mu.Lock()
	if inv.Cluster != h.inv.Cluster {
		h.mu.Unlock()
		return fmt.Errorf("cluster: %q → %q needs a restart of the hub (it names the gossip pool); keeping the previous inventory", h.inv.Cluster, inv.Cluster)
	}
	same, sameBMCs := reflect.DeepEqual(h.inv, inv), slices.EqualFunc(h.inv.Machines, inv.Machines, sameBMC)
	h.inv = inv
	h.mu.Unlock()
	if !same {
		h.say(pass.Notice{Reason: pass.ReasonInventoryReloaded, Message: fmt.Sprintf("inventory reloaded: %d machines", len(inv.Machines))})
	}
	if !sameBMCs {
		h.askBMCCheck() // a corrected address or login shows at once, not at the next check
	}
	return nil
}

// sameBMC says whether a and b are the same machine behind the same BMC, reached the same way.
func sameBMC(a, b pass.Machine) bool {
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

// Reboot reboots a machine on an operator's request, through the same quorum check and journal as the
// hub's own remediations. Refusals wrap ErrRefused and say why and what to do.
func (h *Hub) Reboot(ctx context.Context, req operator.RebootRequest) (operator.RebootResult, error) {
	inv := h.inventory()
	m, ok := inv.Machine(req.Machine)
	if !ok {
		return operator.RebootResult{}, fmt.Errorf("machine %q: %w", req.Machine, ErrNotFound)
	}
	h.rebooting.Lock()
	defer h.rebooting.Unlock()
	strategy := quorum.Reboot
	if req.OwnWay && m.Strategy == quorum.Replace {
		strategy = quorum.Replace
	}
	// What the one admission (pass.AdmitOperator) reads beside the pass's facts.
	h.mu.Lock()
	hubCtx, members := h.ctx, h.view.Cluster.Members
	h.mu.Unlock()
	b := pass.Beside{Standby: h.standby(), LiveErr: errNoMember}
	if hubCtx == nil {
		b.Standby = "the hub is not running yet"
	}
	b.InFlight, _ = h.flightOf(m.Name)
	if m.Member != "" {
		b.Live, b.LiveErr = h.live(ctx)
		b.Work = h.inFlight(inv)
	}
	b.OldQuorum = h.oldQuorumIfOn(ctx, m.Name)
	admitted, err := pass.AdmitOperator(h.operatorFacts(inv, m, strategy), m, pass.OperatorRequest{Strategy: strategy, Force: req.Force, DryRun: req.DryRun}, b)
	plan := admitted.Plan
	res := operator.RebootResult{Steps: plan.StepStrings(), DryRun: req.DryRun, Overrides: admitted.Overrides}
	if err != nil {
		return res, err
	}
	if req.DryRun {
		return res, nil
	}
	by := req.By
	if by == "" {
		by = "operator"
	}
	rem := journal.Remediation{ID: req.Adopt, Machine: m.Name, Strategy: strategy.String(), RequestedBy: by, Reason: "manual " + strategy.String(),
		Steps: plan.Steps, Hard: req.Hard, Forced: admitted.Overrides != "", Attempt: 1}
	if admitted.Overrides != "" {
		rem.Reason += "; forced over: " + admitted.Overrides
	}
	if r, ok := h.cfg.Gossip.Reports()[m.Node]; ok {
		rem.AgentStarted = r.Started
	}
	for _, mb := range members {
		rem.Members = append(rem.Members, mb.Name)
	}
	// A manual remediation outlives the request that started it: it stops with the hub, not the caller.
	rem, err = h.begin(hubCtx, m, rem, plan, time.Time{})
	if err != nil {
		return res, err
	}
	res.Remediation = rem.ID
	return res, nil
}

// errNoMember: a machine that is no etcd member has no quorum to check.
var errNoMember = errors.New("not an etcd member")

// operatorFacts are the facts an operator's request for m is admitted on (pass.MachineHolds): the latest
// pass's assessments, the brakes, the last etcd recovery, the gossip now, and m's BMC login wait (a
// replace by its owner makes no login).
func (h *Hub) operatorFacts(inv pass.Inventory, m pass.Machine, s quorum.Strategy) pass.Facts {
	obs := h.gossipNow()
	f := pass.Facts{Now: obs.Now, Inventory: inv, Observations: obs}
	h.mu.Lock()
	f.Assessments = h.view.Assessments
	h.brakeFactsLocked(&f)
	h.mu.Unlock()
	if why := h.logins.Blocked(m, f.Now); why != "" && s != quorum.Replace {
		f.LoginWait = map[string]string{m.Name: why}
	}
	return f
}
