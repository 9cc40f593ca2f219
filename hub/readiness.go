package hub

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/hub/bmcaccess"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/pass"
)

// guard is the hub's guarded Power of m: every power state its calls read is a BMC finding, as a
// readiness check's is (noteBMCs).
func (h *Hub) guard(m pass.Machine, p execute.Power) execute.Power {
	return h.logins.Guard(m, p, func(m pass.Machine, r pass.BMCReadiness) {
		h.noteBMCs(h.inventory(), map[string]pass.BMCReadiness{m.Name: r})
	})
}

// watchBMCs checks the BMCs now and then every interval (±10 %, so that hubs and accounts do not fall
// into step), until ctx ends.
func (h *Hub) watchBMCs(ctx context.Context, interval time.Duration) {
	for {
		h.checkBMCsOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-h.checkBMCs: // a pass asks for fresh evidence (quorum lost), or the inventory changed
		case <-time.After(time.Duration(float64(interval) * (0.9 + 0.2*rand.Float64()))):
		}
	}
}

// CheckBMCsNow checks every machine's BMC at once, as the periodic check does, for an operator who has
// just fixed one (`hub check --now`), and returns what the hub now knows of each. The login wait of an
// account that refused the credentials is lifted for this check: one login to it, which the operator
// asked for (a refusal again makes the wait longer, as any other would). An account another check is
// reading is checked again once it ends; a machine whose BMC is in use by a remediation, or
// detached, keeps its last finding.
func (h *Hub) CheckBMCsNow(ctx context.Context) []bmcaccess.BMCCheck {
	inv := h.inventory()
	h.checkBMCsOf(ctx, inv, inv.Machines, true)
	h.mu.Lock()
	found := h.bmcs
	h.mu.Unlock()
	return bmcaccess.BMCChecks(inv, found)
}

// checkBMCsOnce checks every machine's BMC but those detached (no BMC call for them) and those with a
// remediation in flight (their BMC is in use: what its calls read is recorded as they answer), records what it
// found and says what changed.
func (h *Hub) checkBMCsOnce(ctx context.Context) {
	inv := h.inventory()
	h.checkBMCsOf(ctx, inv, inv.Machines, false)
}

// checkBMCsOf is checkBMCsOnce for the machines of inv given; now: an operator's (CheckNow).
func (h *Hub) checkBMCsOf(ctx context.Context, inv pass.Inventory, machines []pass.Machine, now bool) {
	h.mu.Lock()
	var todo []pass.Machine
	for _, m := range machines {
		_, detached := h.brakes.Detached[m.Name]
		if h.running[m.Name] == nil && !detached {
			todo = append(todo, m)
		}
	}
	h.mu.Unlock()
	check := h.logins.Check
	if now {
		check = h.logins.CheckNow
	}
	found := check(ctx, todo, h.cfg.PowerFor)
	if ctx.Err() != nil {
		return // the hub stops: what a cancelled call says is no finding
	}
	h.noteBMCs(inv, found)
}

// noteBMCs records what BMC calls found (by machine name: readiness checks, or the power a
// remediation's or a fence's call read), keeps the last finding of the other machines of inv (a
// finding older than the one recorded is dropped), and says what changed.
func (h *Hub) noteBMCs(inv pass.Inventory, found map[string]pass.BMCReadiness) {
	h.mu.Lock()
	before, now, fresh := h.bmcs, map[string]pass.BMCReadiness{}, map[string]pass.BMCReadiness{}
	var hangs map[string][]bmcval.LogEntry
	for _, m := range inv.Machines {
		r, ok := found[m.Name]
		was, known := before[m.Name]
		switch {
		case ok && (!known || !was.Checked.After(r.Checked)):
			r.HealthSince = bmcaccess.HealthSince(was, known, r)
			now[m.Name], fresh[m.Name] = r, r
		case known && m.Endpoint.Driver != "":
			now[m.Name] = was // not checked this time: the last finding stands
		}
		if r := now[m.Name]; r.Ready && len(r.Hangs) > 0 {
			if hangs == nil {
				hangs = map[string][]bmcval.LogEntry{}
			}
			hangs[m.Name] = r.Hangs
		}
	}
	h.bmcs, h.hangs = now, hangs // replaced whole, never changed once published: a pass's facts hold them as they are
	h.mu.Unlock()
	for _, m := range inv.Machines {
		r, ok := fresh[m.Name]
		if !ok {
			continue
		}
		was, known := before[m.Name]
		switch {
		case !r.Ready && (!known || was.Ready || was.Problem != r.Problem):
			h.say(pass.Notice{Machine: m.Name, Reason: pass.ReasonBMCNotReady, Warning: true,
				Message: fmt.Sprintf("%s: BMC not ready (%s): %s; Hale cannot heal this machine until that is fixed", m.Name, r.Problem, r.Error)})
		case r.Ready && known && !was.Ready:
			h.say(pass.Notice{Machine: m.Name, Reason: pass.ReasonBMCReady, Message: fmt.Sprintf("%s: BMC ready again (power %s)", m.Name, r.Power)})
		}
	}
}
