package hub

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/hub/recoveryplan"
	"github.com/hale-dev/hale/quorum"
)

// RecoveryStore keeps the recovery under way across hub restarts: the bbolt journal does (the
// standalone hub's, and the degraded-mode journal of a hub in Kubernetes mode).
type RecoveryStore interface {
	Recovery(ctx context.Context) (*pass.RecoveryRecord, error)
	RecordRecovery(ctx context.Context, r pass.RecoveryRecord) error
}

// underway returns the recovery under way (nil: none), recording it done once the survivor answers as
// a new etcd cluster.
func (h *Hub) underway(ctx context.Context) (*pass.RecoveryRecord, error) {
	store := h.cfg.Recoveries
	if store == nil {
		return nil, nil
	}
	h.recordMu.Lock()
	defer h.recordMu.Unlock()
	rec, err := store.Recovery(ctx)
	if err != nil {
		return nil, err
	}
	h.retire(rec)
	if rec == nil || rec.Done != nil {
		return nil, nil
	}
	s := rec.Plan.Survivor
	for _, r := range h.gossipNow().Reports {
		if e := r.Etcd; e != nil && s != nil && e.LocalName == s.Member && e.ClusterID != "" && e.ClusterID != s.ClusterID {
			now := time.Now().UTC()
			rec.Done, rec.NewClusterID = &now, e.ClusterID
			if err := store.RecordRecovery(ctx, *rec); err != nil {
				return rec, err
			}
			h.log.Info("etcd recovery done: the survivor answers as a new cluster", "survivor", s.Member, "cluster", e.ClusterID, "token", rec.Plan.Token)
			return nil, nil
		}
	}
	return rec, nil
}

// Recover carries the hub's part of a recovery out: it checks the plan (with what the operator
// confirmed), journals it with a new cluster token, pauses the hub, and fences every lost member
// (power off through its BMC, read back Off; by the operator's word where no BMC can). A recovery
// under way is resumed, never begun twice; one that is being carried out right now refuses a second
// caller. The survivor's part is `agent recover` with the returned plan.
func (h *Hub) Recover(ctx context.Context, req operator.RecoverRequest) (pass.RecoveryPlan, error) {
	store := h.cfg.Recoveries
	if store == nil {
		return pass.RecoveryPlan{}, fmt.Errorf("%w: this hub keeps no journal to record a recovery in (in Kubernetes mode, run the hub with --degraded-journal: "+
			"a recovery happens while the API server is down)", ErrRefused)
	}
	if why := h.standby(); why != "" {
		return pass.RecoveryPlan{}, fmt.Errorf("%w: %s", ErrRefused, why)
	}
	if !h.recovering.TryLock() {
		return pass.RecoveryPlan{}, fmt.Errorf("%w: a recovery is being carried out by another `hub recover --yes` right now: wait for it to return", ErrRefused)
	}
	defer h.recovering.Unlock()
	by := cmp.Or(req.By, "operator")
	rec, err := h.underway(ctx)
	if err != nil {
		return pass.RecoveryPlan{}, fmt.Errorf("reading the recovery journal: %w", err)
	}
	inv := h.inventory()
	if rec == nil {
		p := recoveryplan.Of(h.Status(ctx), inv, h.gossipNow(), req)
		if err := recoveryplan.CheckConfirmations(p, req); err != nil {
			return p, err
		}
		if len(p.Blockers) > 0 {
			return p, fmt.Errorf("%w: the recovery plan is not ready: %s", ErrRefused, strings.Join(p.Blockers, "; "))
		}
		p.Token = fmt.Sprintf("hale-%s-%d", p.Survivor.ClusterID, time.Now().Unix())
		h.mu.Lock()
		left, adopt := recoveryplan.PauseToken(h.brakes.Paused)
		h.mu.Unlock()
		if adopt && strings.HasPrefix(left, fmt.Sprintf("hale-%s-", p.Survivor.ClusterID)) {
			// A pause an earlier `hub recover --yes` set and left, its recovery never journaled (the hub
			// was killed while it waited): this one goes on under its token.
			p.Token = left
			h.log.Warn("etcd recovery: adopting the pause an earlier `hub recover --yes` left without beginning", "token", left)
		}
		// operator.Paused (a recorded brake) before the recovery is journaled: a hub killed in between comes
		// back paused with no recovery, never acting with a recovery under way. A pause this call set
		// and that leads to no recovery (the wait given up, the caller gone, the journal refusing) is
		// lifted again: nothing is left behind for a recovery that did not begin.
		set, err := h.pauseForRecovery(ctx, by, p.Token)
		if err == nil {
			rec = &pass.RecoveryRecord{Plan: p, By: by, Began: time.Now().UTC()}
			if err = store.RecordRecovery(ctx, *rec); err != nil {
				err = fmt.Errorf("journaling the recovery before any BMC request: %w", err)
			}
		}
		if err != nil {
			if set {
				h.liftRecoveryPause(by, p.Token, err)
			}
			return p, err
		}
		h.retire(rec)
		h.log.Warn("etcd recovery begun", "by", by, "survivor", p.Survivor.Member, "token", p.Token, "bumpRevision", p.BumpRevision)
	} else if err := recoveryplan.CheckConfirmations(rec.Plan, req); err != nil {
		return rec.Plan, err
	} else if _, err := h.pauseForRecovery(ctx, by, rec.Plan.Token); err != nil {
		return rec.Plan, err // journaled: the pause stays (pauseIfRecovering would set it again at the next start)
	}
	for i := range rec.Plan.Fence {
		f := &rec.Plan.Fence[i]
		if f.Fenced {
			continue
		}
		if err := h.fence(ctx, inv, f, req, by); err != nil {
			return rec.Plan, fmt.Errorf("fencing %s (%s): %w; the recovery is journaled (token %s): run `hub recover --yes` again once it is fixed",
				f.Machine, f.Member, err, rec.Plan.Token)
		}
		if err := store.RecordRecovery(ctx, *rec); err != nil {
			return rec.Plan, fmt.Errorf("journaling the fence of %s: %w", f.Machine, err)
		}
		h.log.Warn("etcd recovery: fenced", "machine", f.Machine, "member", f.Member, "how", f.How, "token", rec.Plan.Token)
	}
	return rec.Plan, nil
}

// pauseIfRecovering pauses a hub that starts with a recovery under way (its brakes lost, or lifted
// meanwhile): a fence may be half done, and nothing may power a fenced member on.
func (h *Hub) pauseIfRecovering(ctx context.Context) error {
	rec, err := h.underway(ctx)
	if err != nil {
		return fmt.Errorf("reading the recovery journal: %w", err)
	}
	if rec == nil {
		return nil
	}
	if err := h.SetPaused(ctx, true, rec.By, recoveryplan.PauseReason(rec.Plan.Token)+" under way (hub recover)"); err != nil {
		// In force all the same (not recorded: the API server is down, say); the next start pauses again.
		h.log.Warn("paused for the etcd recovery under way", "token", rec.Plan.Token, "err", err)
	}
	return nil
}

// pauseForRecovery pauses the hub for the recovery and waits until no remediation is inside an
// irreversible step, for as long as one such step may last (a BMC operation: LongestOperation), saying
// every 5 s what it waits for. set says whether this call paused the hub (it was not paused before).
func (h *Hub) pauseForRecovery(ctx context.Context, by, token string) (set bool, err error) {
	h.mu.Lock()
	set = h.brakes.Paused == nil
	h.mu.Unlock()
	if err := h.SetPaused(ctx, true, by, recoveryplan.PauseReason(token)); err != nil {
		return set, fmt.Errorf("pausing the hub for the recovery: %w", err)
	}
	start, bound := time.Now(), h.cfg.BMC.LongestOperation()
	next := start.Add(5 * time.Second)
	for h.PauseState() != operator.Paused {
		busy := h.busyWith()
		switch now := time.Now(); {
		case now.Sub(start) > bound:
			return set, fmt.Errorf("%w: the hub is pausing for etcd recovery %s, but %s after %v, longer than one BMC operation may take (%v with this hub's "+
				"--bmc-verify-timeout and graceful timeout): its BMC may hang; check it (hub status, hub explain), then run `hub recover --yes` again",
				ErrRefused, token, busy, now.Sub(start).Round(time.Second), bound)
		case now.After(next):
			h.log.Warn("etcd recovery: waiting for the pause", "token", token, "waitingFor", busy, "waited", now.Sub(start).Round(time.Second), "atMost", bound)
			next = now.Add(5 * time.Second)
		}
		select {
		case <-ctx.Done():
			return set, fmt.Errorf("waiting for the pause of etcd recovery %s (%s): %w", token, busy, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return set, nil
}

// busyWith says which remediations are inside an irreversible step, and where.
func (h *Hub) busyWith() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.running {
		if r.busy {
			step := "its last step"
			if r.next < len(r.rem.Steps) {
				step = r.rem.Steps[r.next].String()
			}
			out = append(out, fmt.Sprintf("remediation %s of %s is still inside %s (a BMC operation: it cannot be called back)", r.rem.ID, r.rem.Machine, step))
		}
	}
	slices.Sort(out)
	return cmp.Or(strings.Join(out, "; "), "a remediation was just inside an irreversible step")
}

// liftRecoveryPause lifts the pause a recovery that did not begin set (why: what stopped it).
func (h *Hub) liftRecoveryPause(by, token string, why error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // the caller's may be gone
	defer cancel()
	err := h.setBrake(ctx, fmt.Sprintf("resumed by %s: etcd recovery %s did not begin", by, token), func(b *pass.Brakes) bool {
		if b.Paused == nil || b.Paused.Reason != recoveryplan.PauseReason(token) {
			return false // paused since for another reason: that pause stays
		}
		b.Paused = nil
		return true
	})
	if err != nil {
		h.log.Warn("lifting the pause of a recovery that did not begin", "token", token, "err", err)
	}
	h.log.Warn("etcd recovery did not begin: the pause it set is lifted", "token", token, "err", why)
}

// fence powers a lost member's machine off through its BMC and reads it back Off, or takes the
// operator's word by name where the hub cannot.
func (h *Hub) fence(ctx context.Context, inv pass.Inventory, f *quorum.FenceStep, req operator.RecoverRequest, by string) error {
	confirmed := req.Confirms(f.Machine, f.Member)
	m, ok := inv.Machine(f.Machine)
	if f.ByHand || !ok || m.Endpoint.Driver == "" {
		if !confirmed {
			return fmt.Errorf("%w: the hub cannot fence it (%s): make sure it is off, then confirm it by name (--confirm-lost %s)", ErrRefused, f.How, f.Machine)
		}
		f.Fenced, f.How = true, fmt.Sprintf("confirmed off by name by %s", by)
		return nil
	}
	power, err := h.cfg.PowerFor(m)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	res, err := h.guard(m, power).ForceOff(fctx)
	if err != nil {
		if !confirmed {
			return fmt.Errorf("its BMC (%s): %w: fix the BMC, or make sure by hand that it is off and confirm it by name (--confirm-lost %s)", m.Endpoint, err, f.Machine)
		}
		f.Fenced, f.How = true, fmt.Sprintf("its BMC failed (%v); confirmed off by name by %s", err, by)
		return nil
	}
	f.Fenced, f.How = true, fmt.Sprintf("powered off through its BMC (%s), read back Off: %s", m.Endpoint, res.Evidence)
	return nil
}
