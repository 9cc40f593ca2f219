package hub

import (
	"context"
	"fmt"
	"time"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// Run resumes what the journal says was in progress, then runs passes until ctx ends.
func (h *Hub) Run(ctx context.Context) error {
	h.mu.Lock()
	h.ctx, h.started = ctx, time.Now()
	h.mu.Unlock()
	if err := h.loadBrakes(ctx); err != nil {
		return err
	}
	if err := h.pauseIfRecovering(ctx); err != nil {
		return err
	}
	if err := h.ledger.Load(ctx, h.cfg.Journal, machineNames(h.inventory())); err != nil {
		return err
	}
	h.loadEpisodes(ctx)
	if h.cfg.Marks != nil {
		m, err := h.cfg.Marks.RaftMark(ctx)
		if err != nil {
			return fmt.Errorf("reading the raft mark: %w", err)
		}
		h.state.Mark, h.state.Recorded = m, m
	}
	h.warmUp(ctx)
	h.untilLeading(ctx)
	if err := h.resume(ctx); err != nil {
		return err
	}
	if h.cfg.BMCCheckInterval > 0 {
		go h.watchBMCs(ctx, h.cfg.BMCCheckInterval)
	}
	if h.cfg.Marks != nil {
		go h.marks.run(ctx, h.cfg.Marks.RecordRaftMark, h.advance.markWritten)
	}
	if h.cfg.Episodes != nil {
		go h.episodeLog.run(ctx, h.recordEpisodes, nil)
	}
	go h.watchProofs(ctx)
	if h.cfg.OutOfService != nil {
		go h.taints.Run(ctx, h.cfg.OutOfService, h.machineOfNode, h.say)
		go h.watchFenced(ctx)
	}
	t := time.NewTicker(h.cfg.Tick)
	defer t.Stop()
	for n := uint64(1); ; n++ {
		h.pass(ctx, "")
		h.mu.Lock()
		h.lastPass = time.Now()
		h.mu.Unlock()
		if h.cfg.AfterPass != nil {
			h.cfg.AfterPass(n)
		}
		select {
		case <-ctx.Done():
			h.mu.Lock()
			for _, r := range h.running {
				r.cancel()
			}
			h.mu.Unlock()
			h.beginning.Wait() // a begin queued by the last pass has given up (its journal write ended)
			return nil
		case <-t.C:
		}
	}
}

// pass is one observe → compute → apply round. A pass with listen set only listens: it assesses, says
// what changed and why it does not plan (listen), and begins nothing.
func (h *Hub) pass(ctx context.Context, listen string) {
	if listen == "" {
		listen = h.standby() // remediations it began before go on; nothing new begins
	}
	var rd pass.Ready
	h.state, rd = pass.Compute(h.state, h.observe(listen))
	h.apply(ctx, rd)
}

// apply is a pass's only I/O, in Ready's order: it publishes the pass's view, says what the pass said,
// has the assessor judge again what it gathered while quorum was lost, retires the old members of an
// etcd rebuild Hale did not journal, journals the rebuilt cluster seen healthy, keeps
// the observers joined, hands the raft mark to its writer (how the write went is a fact of a later
// pass), asks for a check of the BMCs, tells the proof watch which BMCs to read, counts and journals
// the episodes that ended, hands the out-of-service taints wanted to their writer, and begins what it
// decided.
func (h *Hub) apply(ctx context.Context, rd pass.Ready) {
	h.mu.Lock()
	h.view = h.state.View
	h.mu.Unlock()
	for _, n := range rd.Notices {
		h.say(n)
	}
	if !rd.QuorumBack.IsZero() {
		// What was gathered while quorum was lost is judged again, from then, before anything is
		// decided on it (a survivor's "no leader" is stale the moment quorum is back).
		h.assessor.QuorumBack(rd.QuorumBack)
	}
	if rec := rd.Retire; rec != nil {
		// Held from this pass on whatever the journal says; journaled so that the next hub holds them too.
		h.retire(rec)
		if store := h.cfg.Recoveries; store == nil {
			h.log.Warn("no journal to record an etcd rebuild in: its old members are held until this hub stops", "token", rec.Plan.Token)
		} else if err := store.RecordRecovery(ctx, *rec); err != nil {
			h.log.Warn("journaling an etcd rebuild: its old members are held until this hub stops", "token", rec.Plan.Token, "err", err)
		}
	}
	if rd.SurvivorSeen != "" {
		h.survivorSeen(ctx, rd.SurvivorSeen)
	}
	if rd.KeepJoined != nil {
		h.cfg.Gossip.KeepJoined(rd.KeepJoined)
	}
	if m := rd.RecordMark; m != nil && h.cfg.Marks != nil {
		h.marks.post(*m)
	}
	if rd.CheckBMCs {
		h.askBMCCheck()
	}
	if rd.Watch != nil {
		h.watch(rd.Watch)
	}
	h.ended(rd.Episodes)
	if rd.OutOfService != nil && h.cfg.OutOfService != nil {
		h.taints.Post(h.inventory(), *rd.OutOfService)
	}
	for _, b := range rd.Begin {
		h.beginQueued(ctx, b)
	}
}

// observe gathers a pass's facts: the gossip's reports and peers, the assessor's verdicts, and a
// snapshot of the hub's own state (the remediations in flight, the brakes, the ledger, the BMC logins
// in their wait).
func (h *Hub) observe(listen string) pass.Facts {
	inv := h.inventory()
	h.assessor.SetPolicy(inv.Policy.Assess)
	h.mu.Lock()
	last, resumed := h.lastPass, h.resumedAt
	bmcs, hangs := h.bmcs, h.hangs // one finding for the assessor and the pass
	h.mu.Unlock()
	if resumed.After(h.resumedSeen) {
		// Evidence gathered while the hub was paused or suspended counts from the resume at the
		// earliest (DESIGN.md rule 12): an operator resumes as soon as the work it paused for is done
		// (an etcd recovery: the rebuilt member answers), before its observers have caught up.
		h.assessor.Resumed(resumed)
		h.resumedSeen = resumed
	}
	if !last.IsZero() && time.Since(last) > maxPassGap {
		// Passes this far apart: the hub was not running (test/chaos seeds 96 and 100: a hub stopped
		// for 7 s power-cycled a member on its pre-stop view 0.1 s after it resumed; the member had
		// recovered meanwhile).
		h.assessor.HeardNothing()
	}
	obs := h.gossipNow()
	obs.Hangs = hangs
	assessments, hearing := h.assessor.AssessHearing(inv.Refs(), inv.Witnesses, obs)
	f := pass.Facts{Now: obs.Now, Inventory: inv, Observations: obs, Assessments: assessments, Hearing: hearing, Listen: listen, History: map[string][]pass.Past{},
		RecentStarts: h.ledger.StartsWithin(obs.Now, inv.Policy.RatePer)}
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
	for _, a := range assessments {
		if _, inFlight := f.Flights[a.Machine]; a.Verdict == assess.VerdictUnhealthy && !inFlight {
			f.History[a.Machine] = h.ledger.Of(a.Machine)
		}
	}
	return f
}

// brakeFactsLocked fills in what the brakes and the last etcd recovery say: who paused the hub, whether
// it is suspended, the detached machines, the retired members. Called with h.mu held.
func (h *Hub) brakeFactsLocked(f *pass.Facts) {
	if h.isPaused() {
		f.Paused = DescribeBrakes(h.pausedBy())
	}
	f.Suspended, f.Detached, f.Retired = h.brakes.Suspended != nil, h.brakes.Detached, h.retired
}

// warmUp listens, without planning or acting, until the agents' reports give a membership to plan
// with (at most StaleAfter): a restarted hub listens before it resumes or starts anything.
func (h *Hub) warmUp(ctx context.Context) {
	wait := h.inventory().Policy.Assess.StaleAfter
	deadline := time.Now().Add(wait)
	for {
		f := h.observe(fmt.Sprintf("warming up: listening to the observers for up to %v before anything is planned", wait))
		_, why := pass.MembershipOf(f.Inventory, f.Observations, f.Assessments, f.Hearing, nil)
		if why == "" || time.Now().After(deadline) {
			return
		}
		var rd pass.Ready
		h.state, rd = pass.Compute(h.state, f)
		h.apply(ctx, rd)
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.cfg.Tick):
		}
	}
}

// untilLeading listens (nothing resumed, nothing started) while this hub stands by.
func (h *Hub) untilLeading(ctx context.Context) {
	for {
		why := h.standby()
		if why == "" {
			return
		}
		h.pass(ctx, why)
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.cfg.Tick):
		}
	}
}
