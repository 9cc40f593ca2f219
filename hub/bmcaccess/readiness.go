package bmcaccess

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/pass"
)

// A BMC is checked before the day it is needed: at the start of a leading hub, then every
// BMCCheckInterval, each machine's BMC is asked for its power state (it answers, takes the login, has
// the system, reads the power). A failure is said (notice, Event), shown (status, explain), counted
// (hale_hub_bmc_ready) and alerted on (HaleBMCNotReady), so that a wrong password or a dead BMC
// network is found on day 0, not in the first outage. `hub check` makes the same check once.

// checkParallel bounds how many BMC accounts are checked at once; checkRetries how many times a
// check retries a BMC that does not answer (a remediation's call to the account waits for the check:
// at most 2 requests' time).
const checkParallel, checkRetries = 8, 1

// CheckBMCs checks the BMC of each machine that has one, once, and returns what it found by machine
// name. The machines of one BMC account are checked one after another, and once the account refuses
// the login the others are not tried (they say so): BMC accounts lock after a few failed Logins.
// Accounts are checked side by side, a few at a time.
func CheckBMCs(ctx context.Context, machines []pass.Machine, powerFor func(pass.Machine) (execute.Power, error)) map[string]pass.BMCReadiness {
	return NewLogins(0).Check(ctx, machines, powerFor)
}

// Check is CheckBMCs through l: no login to an account that waits, and a machine whose BMC a call
// uses, or another check, is not checked (it has no finding in the result).
func (l *Logins) Check(ctx context.Context, machines []pass.Machine, powerFor func(pass.Machine) (execute.Power, error)) map[string]pass.BMCReadiness {
	return l.check(ctx, machines, powerFor, false)
}

// CheckNow is Check for an operator who has just fixed a BMC: an account another check is reading
// is checked once that check ends (what it finds may predate the fix).
func (l *Logins) CheckNow(ctx context.Context, machines []pass.Machine, powerFor func(pass.Machine) (execute.Power, error)) map[string]pass.BMCReadiness {
	return l.check(ctx, machines, powerFor, true)
}

func (l *Logins) check(ctx context.Context, machines []pass.Machine, powerFor func(pass.Machine) (execute.Power, error), now bool) map[string]pass.BMCReadiness {
	accounts := map[loginKey][]pass.Machine{}
	for _, m := range machines {
		if m.Endpoint.Driver != "" {
			accounts[keyOf(m)] = append(accounts[keyOf(m)], m)
		}
	}
	out := map[string]pass.BMCReadiness{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, checkParallel)
	for _, k := range slices.SortedFunc(maps.Keys(accounts), func(a, b loginKey) int { return cmp.Or(cmp.Compare(a.bmc, b.bmc), cmp.Compare(a.user, b.user)) }) {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			refusedFor := ""
			for _, m := range accounts[k] {
				var r pass.BMCReadiness
				if refusedFor == "" {
					var checked bool
					if r, checked = checkBMC(ctx, m, powerFor, l, now); !checked {
						continue // its BMC is in use: the last finding stands
					}
				} else {
					r = pass.BMCReadiness{Checked: time.Now().UTC(), Problem: bmc.ProblemLogin,
						Error: fmt.Sprintf("%s status: not tried: the BMC refused the login of user %q for %s just before (BMC accounts lock after a few failed Logins)", m.Endpoint, m.Credentials.Username, refusedFor)}
				}
				if r.Problem == bmc.ProblemLogin && refusedFor == "" {
					refusedFor = m.Name
				}
				mu.Lock()
				out[m.Name] = r
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// checkBMC reads m's power state, health and the hangs its event log records (evidence) through the
// hub's login record (guardCheck): no login to an account that waits, none while a call (a
// remediation's step) uses the account (ok false: not checked this time), and no call logs in while
// the check does.
func checkBMC(ctx context.Context, m pass.Machine, powerFor func(pass.Machine) (execute.Power, error), l *Logins, now bool) (r pass.BMCReadiness, ok bool) {
	r.Checked = time.Now().UTC()
	p, err := powerFor(m)
	if err != nil {
		r.Problem, r.Error = pass.ProblemConfig, err.Error()
		return r, true
	}
	ev, err := evidenceOf(bmc.WithRetries(ctx, checkRetries), l.guardCheck(m, p, now))
	if errors.Is(err, errAccountBusy) {
		return pass.BMCReadiness{}, false
	}
	r.Ready, r.Problem = err == nil, bmc.ProblemOf(err)
	if err != nil {
		r.Error = err.Error()
		return r, true
	}
	r.Power, r.Health, r.Hangs, r.LogError = ev.Power, ev.Health, ev.Hangs, ev.LogError
	if !ev.Read.IsZero() {
		r.Checked = ev.Read.UTC()
	}
	return r, true
}

// evidencer is a Power that reads what its BMC says of a hang (bmc.Controller; guarded).
type evidencer interface {
	Evidence(ctx context.Context) (bmc.Evidence, error)
}

// evidenceOf reads p's evidence, or only its power state when p reads no more (a test's fake BMC).
func evidenceOf(ctx context.Context, p execute.Power) (bmc.Evidence, error) {
	if e, ok := p.(evidencer); ok {
		return e.Evidence(ctx)
	}
	st, _, err := p.Status(ctx)
	return bmc.Evidence{Power: st, Read: time.Now()}, err
}

// HealthSince is when r's health was first read as it is now: was's when was read it so too, r's own
// when was read another, zero when unknown (no reading before, or one that did not say).
func HealthSince(was pass.BMCReadiness, known bool, r pass.BMCReadiness) time.Time {
	switch {
	case r.Health == "" || !known || was.Health == "":
		return time.Time{}
	case was.Health == r.Health:
		return was.HealthSince
	}
	return r.Checked
}

// BMCCheck is one machine's line of a BMC check: its BMC (empty: it has none) and what was found.
type BMCCheck struct {
	Machine  string `json:"machine"`
	Endpoint string `json:"endpoint,omitempty"`
	pass.BMCReadiness
}

// BMCChecks are inv's machines, in its order, with what found says of their BMCs.
func BMCChecks(inv pass.Inventory, found map[string]pass.BMCReadiness) []BMCCheck {
	var rows []BMCCheck
	for _, m := range inv.Machines {
		row := BMCCheck{Machine: m.Name}
		if m.Endpoint.Driver != "" {
			row.Endpoint, row.BMCReadiness = m.Endpoint.String(), found[m.Name]
		}
		rows = append(rows, row)
	}
	return rows
}
