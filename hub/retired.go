package hub

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/pass"
)

// What a recovery leaves behind. `hub recover` and `agent recover` rebuild etcd from the survivor as a
// new cluster (a new cluster ID). The old cluster's other members, those the recovery fenced and those
// that answered but were behind, keep the old data on their disks, and a machine of theirs that runs
// runs its old member. One alone, or any number short of the old cluster's quorum, serves nothing; a
// quorum of them running brings the old cluster back beside the new one, serving the old data (two
// etcds, two truths). So until each one is back in the new cluster (`agent rejoin` on it), the hub
// holds its machine, never powering it on or cycling it by itself, and `hub reboot` powers one on only
// while the old members that may run stay short of the old quorum.

// followRebuild holds the old members of an etcd rebuild Hale did not journal, from this pass on
// whatever the journal says, and journals it so that the next hub holds them too (rec; nil: none);
// and journals what the pass saw of the last recovery's rebuilt cluster (seen: its survivor healthy,
// old members back in it).
func (h *Hub) followRebuild(ctx context.Context, rec *pass.RecoveryRecord, seen pass.Seen) {
	if rec != nil {
		h.retire(rec)
		if store := h.cfg.Recoveries; store == nil {
			h.log.Warn("no journal to record an etcd rebuild in: its old members are held until this hub stops", "token", rec.Plan.Token)
		} else if err := store.RecordRecovery(ctx, *rec); err != nil {
			h.log.Warn("journaling an etcd rebuild: its old members are held until this hub stops", "token", rec.Plan.Token, "err", err)
		}
	}
	if seen.Token != "" {
		h.saw(ctx, seen)
	}
}

// retire records the old cluster the journaled recovery rec replaces (nil: none).
func (h *Hub) retire(rec *pass.RecoveryRecord) {
	r := pass.RetirementOf(rec)
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.Token != h.retired.Token {
		// Executors held at a checkpoint (paused) look again: one overtaken by the recovery ends.
		close(h.resumed)
		h.resumed = make(chan struct{})
	}
	if r.Token == h.retired.Token {
		// Seen by this hub, even if the journal did not take it: the survivor healthy, members rejoined.
		r.SurvivorSeen = r.SurvivorSeen || h.retired.SurvivorSeen
		r.Members = slices.DeleteFunc(r.Members, func(x pass.Retiree) bool { return !slices.Contains(h.retired.Members, x) })
	}
	h.retired = r
}

// saw journals what a pass saw of a recovery's rebuilt cluster for the first time: its survivor
// healthy, old members back in it. Either is held no longer in this hub at once; not journaled (no
// journal, or it fails), the next hub holds it until it sees it again.
func (h *Hub) saw(ctx context.Context, s pass.Seen) {
	h.mu.Lock()
	if h.retired.Token == s.Token {
		// A copy: the pass's facts share the slice.
		h.retired.Members = slices.DeleteFunc(slices.Clone(h.retired.Members), func(x pass.Retiree) bool { return slices.Contains(s.Rejoined, x) })
		h.retired.SurvivorSeen = h.retired.SurvivorSeen || s.Survivor
	}
	h.mu.Unlock()
	store := h.cfg.Recoveries
	if store == nil {
		return
	}
	h.recordMu.Lock()
	defer h.recordMu.Unlock()
	rec, err := store.Recovery(ctx)
	if err == nil && rec != nil && rec.Plan.Token == s.Token && record(rec, s, time.Now().UTC()) {
		err = store.RecordRecovery(ctx, *rec)
	}
	if err != nil {
		h.log.Warn("journaling the rebuilt etcd cluster seen healthy on its survivor or old members back in it: the next hub holds them until it sees them again",
			"token", s.Token, "err", err)
	}
}

// record records in rec what s saw, the first time at now; false: nothing new.
func record(rec *pass.RecoveryRecord, s pass.Seen, now time.Time) bool {
	changed := false
	if s.Survivor && rec.SurvivorSeen == nil {
		rec.SurvivorSeen, changed = &now, true
	}
	for _, x := range s.Rejoined {
		if _, ok := rec.Rejoined[x.Member]; !ok {
			if rec.Rejoined == nil {
				rec.Rejoined = map[string]time.Time{}
			}
			rec.Rejoined[x.Member], changed = now, true
		}
	}
	return changed
}

// oldQuorumIfOn says why powering machine on would run the old cluster's quorum (pass.ReasonOldQuorum):
// the old cluster's members that may run (each not back in the new cluster, whose agent reports or
// whose BMC does not read it Off now) would, with it, reach that quorum. "": it would not, or machine
// is not retired.
func (h *Hub) oldQuorumIfOn(ctx context.Context, machine string) string {
	h.mu.Lock()
	r := h.retired
	h.mu.Unlock()
	inv := h.inventory()
	obs := h.gossipNow()
	stale := inv.Policy.Assess.StaleAfter
	if _, retired := r.Hold(machine, obs, stale); !retired {
		return ""
	}
	var running []string
	for _, x := range r.Members {
		if x.Machine == machine {
			continue
		}
		if rejoined, _ := r.Where(x, obs, stale); rejoined {
			continue
		}
		if why := h.mayRun(ctx, inv, x, obs); why != "" {
			running = append(running, fmt.Sprintf("%s (%s): %s", x.Machine, x.Member, why))
		}
	}
	if len(running)+1 < r.Quorum {
		return ""
	}
	return fmt.Sprintf("%s was retired by etcd recovery %s and would run %s of the old cluster %s; with %s, "+
		"%d of the old cluster's members would run, its quorum (%d): the old cluster would serve its old data beside the new one. "+
		"Run `agent rejoin` on those first, one machine at a time", machine, r.Token, r.MemberOf(machine), r.Cluster,
		strings.Join(running, "; "), len(running)+1, r.Quorum)
}

// mayRun says why a retired member's machine may be running ("": its agent does not report, no
// remediation of it is in flight and its BMC reads it Off now).
func (h *Hub) mayRun(ctx context.Context, inv pass.Inventory, x pass.Retiree, obs assess.Observations) string {
	m, ok := inv.Machine(x.Machine)
	if !ok {
		return "not in the inventory: its power cannot be read"
	}
	if rep, reports := obs.Reports[m.Node]; reports && assess.Live(rep, obs, inv.Policy.Assess.StaleAfter) {
		return "its agent reports"
	}
	if flight, inFlight := h.flightOf(m.Name); inFlight {
		// An operator's power-on of it, begun and not yet read back: its BMC may still read Off.
		return fmt.Sprintf("remediation %s of it is in flight", flight)
	}
	power, err := h.cfg.PowerFor(m) // Kubernetes mode: a BareMetalHost, or the inventory file's BMC
	if err != nil {
		return fmt.Sprintf("its power cannot be read (%v)", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	st, _, err := h.guard(m, power).Status(rctx)
	switch {
	case err != nil:
		return fmt.Sprintf("its BMC cannot be read (%v)", err)
	case st != bmc.PowerOff:
		return fmt.Sprintf("its BMC reads the power %s", st)
	}
	return ""
}
