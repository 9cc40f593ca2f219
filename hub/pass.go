package hub

import (
	"context"
	"fmt"
	"time"

	"github.com/hale-dev/hale/hub/pass"
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
	f := h.observe(listen)
	var rd pass.Ready
	h.state, rd = pass.Compute(h.state, f)
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
		// decided on it (a survivor's "no leader" is stale the moment quorum is back): the next
		// round tells the assessor.
		h.quorumBack = rd.QuorumBack
	}
	h.followRebuild(ctx, rd.Retire, rd.Seen)
	if rd.KeepJoined != nil {
		h.cfg.Gossip.KeepJoined(rd.KeepJoined)
	}
	if m := rd.RecordMark; m != nil && h.cfg.Marks != nil {
		h.marks.post(*m)
	}
	if rd.CheckBMCs {
		h.askBMCCheck()
	}
	h.followEpisodes(rd.Watch, rd.Episodes)
	if rd.OutOfService != nil && h.cfg.OutOfService != nil {
		h.taints.Post(h.inventory(), *rd.OutOfService)
	}
	for _, b := range rd.Begin {
		h.beginQueued(ctx, b)
	}
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
