package hub

import (
	"time"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// observe gathers a pass's facts: why it only listens (listen; "": whatever Config.Standby says), the
// gossip's reports and peers, the assessor's verdicts (told what happened to the hub since the last
// round: assess.Round), and a snapshot of the hub's own state (the remediations in flight, the
// brakes, the ledger, the BMC logins in their wait).
func (h *Hub) observe(listen string) pass.Facts {
	if listen == "" {
		listen = h.standby() // remediations it began before go on; nothing new begins
	}
	inv := h.inventory()
	h.mu.Lock()
	last, resumed := h.lastPass, h.resumedAt
	bmcs, hangs := h.bmcs, h.hangs // one finding for the assessor and the pass
	h.mu.Unlock()
	obs := h.gossipNow()
	obs.Hangs = hangs
	assessments, hearing := h.assessor.Judge(assess.Round{Policy: inv.Policy.Assess, Machines: inv.Refs(), Witnesses: inv.Witnesses, Obs: obs,
		ResumedAt: resumed, QuorumBack: h.quorumBack,
		// Passes this far apart: the hub was not running (test/chaos seeds 96 and 100: a hub stopped
		// for 7 s power-cycled a member on its pre-stop view 0.1 s after it resumed; the member had
		// recovered meanwhile).
		HeardNothing: !last.IsZero() && time.Since(last) > maxPassGap})
	h.quorumBack = time.Time{}
	f := pass.Facts{Now: obs.Now, Inventory: inv, Observations: obs, Assessments: assessments, Hearing: hearing, Listen: listen}
	h.mu.Lock()
	f.Flights, f.BMCs = h.flightsLocked(), bmcs
	h.brakeFactsLocked(&f)
	h.mu.Unlock()
	// After the flights: a begin that failed is told before its flight goes (beginQueued).
	f.Begun, f.MarkWritten = h.advance.collect()
	for _, m := range inv.Machines {
		if why := h.logins.Blocked(m, f.Now); why != "" && m.Strategy != quorum.Replace {
			if f.LoginWait == nil {
				f.LoginWait = map[string]string{}
			}
			f.LoginWait[m.Name] = why
		}
	}
	var unhealthy []string // whose history the pass weighs
	for _, a := range assessments {
		if _, inFlight := f.Flights[a.Machine]; a.Verdict == assess.VerdictUnhealthy && !inFlight {
			unhealthy = append(unhealthy, a.Machine)
		}
	}
	f.RecentStarts, f.History = h.ledger.Read(f.Now, inv.Policy.RatePer, unhealthy)
	return f
}

// inventory is the inventory in force, its policy overridden where an override says (SetPolicyOverride).
func (h *Hub) inventory() pass.Inventory {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.inventoryLocked()
}

func (h *Hub) inventoryLocked() pass.Inventory {
	inv := h.inv
	inv.Policy = h.override.Apply(inv.Policy)
	return inv
}

// gossipNow is what the gossip pool shows now.
func (h *Hub) gossipNow() assess.Observations {
	obs := assess.Observations{Now: time.Now(), Reports: h.cfg.Gossip.Reports(), HubPeers: map[string]health.PeerView{}}
	for _, p := range h.cfg.Gossip.Peers() {
		obs.HubPeers[p.Name] = p
	}
	return obs
}

// standby says why this hub must not act now, or "".
func (h *Hub) standby() string {
	if h.cfg.Standby == nil {
		return ""
	}
	return h.cfg.Standby()
}

// flightsLocked snapshots the remediations under way (h.mu held).
func (h *Hub) flightsLocked() map[string]pass.Flight {
	out := make(map[string]pass.Flight, len(h.running))
	for name, r := range h.running {
		out[name] = pass.Flight{Plan: r.plan, Next: r.next, Members: r.rem.Members}
	}
	return out
}
