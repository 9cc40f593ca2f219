package hub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/hub/recoveryplan"
	"github.com/hale-dev/hale/quorum"
)

// On a running hub, with witnesses so that it still hears a majority: two of three members go silent
// while their BMCs read them on (the far side of a partition, as far as the hub can tell), and the only
// member that answers is behind the mark. The plan names the survivor and the data at risk, and is
// blocked by both. Once their BMCs do not answer, the loss is for good (said, counted); once the
// survivor has caught up to the mark, the plan is ready.
func TestRecoveryPlanOnARunningHub(t *testing.T) {
	var mu sync.Mutex
	var said []string
	r, pool := lossRig(t, func(r *passRig) {
		r.hub.cfg.OnNotice = func(_ time.Time, msg string) { mu.Lock(); said = append(said, msg); mu.Unlock() }
	})
	ctx := t.Context()
	p := r.hub.RecoveryPlan(ctx)
	require.Len(t, p.Blockers, 1)
	assert.Contains(t, p.Blockers[0], "etcd's quorum is not lost")

	r.loseTwo(t, 50)
	st := r.hub.Status(ctx)
	assert.False(t, st.QuorumLoss.ForGood, "their BMCs read them on")
	p = r.hub.RecoveryPlan(ctx)
	require.NotNil(t, p.Survivor)
	assert.Equal(t, "etcd-0", p.Survivor.Member)
	assert.Equal(t, uint64(50), p.DataAtRisk)
	require.Len(t, p.Blockers, 3, "%q", p.Blockers)
	assert.Contains(t, p.Blockers[0], "cp-1 (etcd-1): its BMC reads the host powered on")
	assert.Contains(t, p.Blockers[1], "cp-2 (etcd-2): its BMC reads the host powered on")
	assert.Contains(t, p.Blockers[2], "etcd-0 is at raft index")

	// Their BMCs stop answering: lost for good.
	inv := r.hub.inventory()
	inv.Machines = slices.Clone(inv.Machines)
	silent, err := bmc.ParseEndpoint("redfish+http://127.0.0.1:1/redfish/v1/Systems/x")
	require.NoError(t, err)
	inv.Machines[1].Endpoint, inv.Machines[2].Endpoint = silent, silent
	require.NoError(t, r.hub.SetInventory(inv))
	r.hub.checkBMCsOnce(ctx)
	require.Eventually(t, func() bool {
		l := r.hub.Status(ctx).QuorumLoss
		return l != nil && l.ForGood
	}, 10*time.Second, 10*time.Millisecond)
	mu.Lock()
	assert.True(t, slices.ContainsFunc(said, func(s string) bool { return strings.HasPrefix(s, "quorum lost FOR GOOD") }), "%q", said)
	mu.Unlock()
	p = r.hub.RecoveryPlan(ctx)
	require.Len(t, p.Blockers, 3, "%q", p.Blockers)
	assert.Contains(t, p.Blockers[0], "cp-1 (etcd-1): the hub cannot fence it")
	assert.Contains(t, p.Blockers[2], "50 entries behind the journaled mark")
	assert.Contains(t, p.Fence[0].How, "does not answer: make sure by hand that it is off")

	pool.mu.Lock()
	pool.behind["cp-0"] = 0
	pool.mu.Unlock()
	p = r.hub.RecoveryPlan(ctx)
	assert.Len(t, p.Blockers, 2, "the survivor at the mark: only the operator's word is missing")
	assert.Zero(t, p.DataAtRisk)
	assert.Equal(t, uint64(recoveryplan.MinBump), p.BumpRevision)

	// The hub cannot fence them: the operator's word, by name.
	p, err = r.hub.Recover(ctx, operator.RecoverRequest{ConfirmLost: []string{"cp-1", "etcd-2"}, By: "alice"})
	require.NoError(t, err)
	assert.NotEmpty(t, p.Token)
	for _, f := range p.Fence {
		assert.True(t, f.Fenced, f.Machine)
		assert.Equal(t, "confirmed off by name by alice", f.How)
	}
}

// Power that does not come on is evidence at the first try: a power-cycle of a lost voter whose BMC
// accepts On and goes on reading Off (a dead power supply) records that reading, so quorum is lost
// for good before any retry, with no readiness check in between (the BMCs are checked once an hour
// here, and a remediation's machine is never checked while it runs).
func TestPowerThatDoesNotComeOnIsEvidence(t *testing.T) {
	r, _ := lossRig(t, func(r *passRig) {
		r.hub.cfg.PowerFor = func(m pass.Machine) (execute.Power, error) {
			c := r.hub.cfg
			c.BMC.VerifyTimeout = 300 * time.Millisecond
			return c.BMCPower(m)
		}
	})
	ctx := t.Context()
	r.loseTwo(t, 0)
	require.False(t, r.hub.Status(ctx).QuorumLoss.ForGood, "their BMCs read them on")
	for _, name := range []string{"cp-1", "cp-2"} {
		r.sim.SetDead(name, true)
	}
	r.reporting()
	require.NoError(t, r.hub.SetSuspended(ctx, false, "alice", ""))
	require.Eventually(t, func() bool {
		l := r.hub.Status(ctx).QuorumLoss
		return l != nil && l.ForGood
	}, 10*time.Second, 10*time.Millisecond)
	for i, v := range r.hub.Status(ctx).QuorumLoss.Lost {
		assert.Contains(t, v.Evidence, "its BMC read the power Off", v.Member)
		assert.Equal(t, bmc.PowerOff, r.machine(v.Machine).BMC.Power, "status shows the reading (%d)", i)
		// Said as the call read it: the remediation ends a moment later, the first and only one.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			hist, err := r.hub.History(ctx, v.Machine)
			require.NoError(c, err)
			if assert.Len(c, hist, 1, "one power-cycle of %s", v.Machine) {
				assert.Equal(c, journal.Failed, hist[0].State)
			}
		}, 10*time.Second, 10*time.Millisecond)
	}
}

// `hub recover --yes` on a running hub: refused, with nothing changed, until every lost member that
// reads powered on is confirmed by name and the data at risk is accepted by its size; then journaled,
// the hub paused, every lost member powered off through its (simulated Redfish) BMC and read back
// Off. Run again, it resumes the same recovery; two at once, the second is refused; the survivor
// answering as a new cluster ends it.
func TestRecoverFencesThroughTheBMCs(t *testing.T) {
	r, pool := lossRig(t, nil)
	ctx := t.Context()
	r.loseTwo(t, 50)

	unchanged := func() {
		t.Helper()
		assert.Equal(t, "On", r.sim.PowerState("cp-1"))
		assert.Equal(t, "On", r.sim.PowerState("cp-2"))
		assert.Equal(t, operator.Running, r.hub.PauseState())
		rec, err := r.hub.cfg.Recoveries.Recovery(ctx)
		require.NoError(t, err)
		assert.Nil(t, rec, "nothing journaled")
	}
	for _, tc := range []struct {
		req  operator.RecoverRequest
		want []string
	}{
		{operator.RecoverRequest{}, []string{"cp-1 (etcd-1): its BMC reads the host powered on", "--confirm-lost cp-2", "--accept-data-loss 50"}},
		{operator.RecoverRequest{ConfirmLost: []string{"cp-1"}, AcceptDataLoss: 50}, []string{"--confirm-lost cp-2"}},
		{operator.RecoverRequest{ConfirmLost: []string{"cp-1", "cp-2"}, AcceptDataLoss: 49}, []string{"--accept-data-loss 50"}},
		{operator.RecoverRequest{ConfirmLost: []string{"cp-1", "cp-9"}}, []string{"--confirm-lost cp-9: not a lost voter of the plan (lost: cp-1, cp-2)"}},
	} {
		_, err := r.hub.Recover(ctx, tc.req)
		require.ErrorIs(t, err, ErrRefused, "%+v", tc.req)
		for _, w := range tc.want {
			assert.Contains(t, err.Error(), w)
		}
		unchanged()
	}
	r.hub.recovering.Lock()
	_, err := r.hub.Recover(ctx, operator.RecoverRequest{})
	r.hub.recovering.Unlock()
	require.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), "being carried out by another `hub recover --yes` right now")
	unchanged()

	confirmed := operator.RecoverRequest{ConfirmLost: []string{"cp-1", "cp-2"}, AcceptDataLoss: 50, By: "alice"}
	p, err := r.hub.Recover(ctx, confirmed)
	require.NoError(t, err)
	require.NotEmpty(t, p.Token)
	assert.Equal(t, "etcd-0", p.Survivor.Member)
	for _, f := range p.Fence {
		assert.True(t, f.Fenced, f.Machine)
		assert.Contains(t, f.How, "powered off through its BMC")
		assert.Equal(t, "Off", r.sim.PowerState(f.Machine), f.Machine)
	}
	assert.Equal(t, "On", r.sim.PowerState("cp-0"), "the survivor is never fenced")
	assert.Equal(t, operator.Paused, r.hub.PauseState())
	rec, err := r.hub.cfg.Recoveries.Recovery(ctx)
	require.NoError(t, err)
	require.NotNil(t, rec)
	assert.Equal(t, p.Token, rec.Plan.Token)
	assert.Equal(t, "alice", rec.By)
	assert.Contains(t, p.String(), "every lost member is fenced; go on on the survivor with `agent recover --plan FILE`")

	// Again: the same recovery, resumed; nothing sent to the BMCs.
	resets := len(r.sim.Resets("cp-1"))
	again, err := r.hub.Recover(ctx, operator.RecoverRequest{})
	require.NoError(t, err)
	assert.Equal(t, p.Token, again.Token)
	assert.Len(t, r.sim.Resets("cp-1"), resets)
	assert.Equal(t, p.Token, r.hub.RecoveryPlan(ctx).Token, "the plan shown is the one under way")

	// The survivor answers as a new cluster: the recovery is done, a new plan is made again.
	pool.mu.Lock()
	pool.clusterID = "5eed"
	pool.mu.Unlock()
	assert.Empty(t, r.hub.RecoveryPlan(ctx).Token)
	rec, err = r.hub.cfg.Recoveries.Recovery(ctx)
	require.NoError(t, err)
	require.NotNil(t, rec.Done)
	assert.Equal(t, "5eed", rec.NewClusterID)
	// Done: the hub, resumed, is not paused again at its next start.
	require.NoError(t, r.hub.SetPaused(ctx, false, "alice", ""))
	require.NoError(t, r.hub.pauseIfRecovering(ctx))
	assert.Equal(t, operator.Running, r.hub.PauseState())
}

// A fence that fails (the BMC errs) leaves the recovery journaled with what was fenced: run again once
// the BMC answers, the same recovery goes on from there, the fenced machine untouched.
func TestRecoverResumesAFailedFence(t *testing.T) {
	var cp2Fails atomic.Bool // set while the hub's goroutines may read it
	r, _ := lossRig(t, func(r *passRig) {
		power := r.hub.cfg.PowerFor
		r.hub.cfg.PowerFor = func(m pass.Machine) (execute.Power, error) {
			if m.Name == "cp-2" && cp2Fails.Load() {
				return nil, errors.New("connect: connection refused")
			}
			return power(m)
		}
	})
	ctx := t.Context()
	r.loseTwo(t, 0)

	cp2Fails.Store(true)
	req := operator.RecoverRequest{ConfirmLost: []string{"cp-1", "cp-2"}}
	_, err := r.hub.Recover(ctx, req)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "fencing cp-2 (etcd-2): connect: connection refused; the recovery is journaled")
	rec, err := r.hub.cfg.Recoveries.Recovery(ctx)
	require.NoError(t, err)
	require.NotNil(t, rec)
	assert.True(t, rec.Plan.Fence[0].Fenced)
	assert.False(t, rec.Plan.Fence[1].Fenced)
	assert.Equal(t, "Off", r.sim.PowerState("cp-1"))
	assert.Contains(t, r.hub.RecoveryPlan(ctx).String(), "not every lost member is fenced yet")
	// A hub that starts with this recovery under way is paused, its brakes lifted or not (Run).
	require.NoError(t, r.hub.SetPaused(ctx, false, "alice", ""))
	require.Equal(t, operator.Running, r.hub.PauseState())
	require.NoError(t, r.hub.pauseIfRecovering(ctx))
	require.Eventually(t, func() bool { return r.hub.PauseState() == operator.Paused }, 5*time.Second, 10*time.Millisecond)

	cp2Fails.Store(false)
	resets := len(r.sim.Resets("cp-1"))
	p, err := r.hub.Recover(ctx, operator.RecoverRequest{})
	require.NoError(t, err)
	assert.Equal(t, rec.Plan.Token, p.Token, "the same recovery")
	assert.True(t, p.Fence[1].Fenced)
	assert.Equal(t, "Off", r.sim.PowerState("cp-2"))
	assert.Len(t, r.sim.Resets("cp-1"), resets, "the machine fenced before is not touched again")
}

// lossRig is a hub over three machines and two witnesses (so that it still hears a majority when two
// machines go silent), running and suspended: nothing is power-cycled. Only the start and a quorum loss
// check the BMCs.
func lossRig(t *testing.T, setup func(*passRig)) (*passRig, *testPool) {
	pool := newTestPool(3)
	pool.witnesses = []string{"w-1", "w-2"}
	p := testPolicy()
	p.StallTolerance = pass.PerQuorum{Held: time.Second, Needed: time.Second} // these tests are of what comes after (TestStall*: the tolerance)
	r := newPassRig(t, pool, p, nil)
	r.hub.cfg.BMCCheckInterval = time.Hour
	r.hub.cfg.BMC.Retries = -1
	if setup != nil {
		setup(r)
	}
	r.run(t)
	r.awaitPasses(t, 3)
	require.NoError(t, r.hub.SetSuspended(t.Context(), true, "test", "nothing power-cycled"))
	return r, pool
}

// loseTwo has cp-0 fall behind by behind entries, then cp-1 and cp-2 go silent (their BMCs still read
// them on), and waits until the hub finds quorum lost and has read their BMCs since.
func (r *passRig) loseTwo(t *testing.T, behind uint64) {
	pool := r.pool
	pool.mu.Lock()
	pool.behind["cp-0"] = behind
	pool.mu.Unlock()
	r.awaitPasses(t, 3)
	pool.mu.Lock()
	pool.frozen = true
	pool.dead["cp-1"], pool.dead["cp-2"] = true, true
	pool.mu.Unlock()
	lost := time.Now()
	require.Eventually(t, func() bool {
		st := r.hub.Status(t.Context())
		return st.QuorumLoss != nil && len(st.QuorumLoss.Lost) == 2 && st.Machines[1].BMC != nil && st.Machines[1].BMC.Checked.After(lost) &&
			st.Machines[2].BMC != nil && st.Machines[2].BMC.Checked.After(lost)
	}, 10*time.Second, 10*time.Millisecond, "quorum lost, and the BMCs checked again at once")
	// The loss's evidence is the pass's: a whole pass after those readings (a loaded -race run had the
	// plan say "no evidence" in 5 of 150, the readings in the status but not yet in a pass).
	r.awaitPasses(t, 2)
}

// reporting has the live agents send new reports again (loseTwo froze them, to hold the raft indexes
// where the loss left them): the evidence a resumed hub acts on is in reports sent since the resume.
func (r *passRig) reporting() {
	r.pool.mu.Lock()
	r.pool.frozen = false
	r.pool.mu.Unlock()
}

// After a recovery, the old cluster's other members are retired. The hub, resumed, holds them: it never
// powers one on by itself (its disk may hold the old cluster's member). `hub reboot` powers one on only
// while the old members that may run stay short of the old quorum, --force or not; a member back in
// the new cluster is released.
func TestRetiredMembersAfterARecovery(t *testing.T) {
	r, pool := lossRig(t, nil)
	ctx := t.Context()
	r.loseTwo(t, 0)
	// The hub power-cycles the silent voters; the recovery begins with a remediation under way.
	r.reporting()
	require.NoError(t, r.hub.SetSuspended(ctx, false, "alice", ""))
	require.Eventually(t, func() bool { return r.machine("cp-1").Remediation != nil || r.machine("cp-2").Remediation != nil },
		10*time.Second, 10*time.Millisecond)
	p, err := r.hub.Recover(ctx, operator.RecoverRequest{ConfirmLost: []string{"cp-1", "cp-2"}})
	require.NoError(t, err)
	// It is overtaken: it ends (Aborted), and does not power the machine on again.
	for _, name := range []string{"cp-1", "cp-2"} {
		require.Eventually(t, func() bool { return r.machine(name).Remediation == nil }, 10*time.Second, 10*time.Millisecond, name)
	}
	// The survivor, its rebuilt cluster not yet seen: an operator's reboot of it says what it risks.
	_, err = r.hub.Reboot(ctx, operator.RebootRequest{Machine: "cp-0", DryRun: true})
	require.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), "cp-0 is the survivor etcd recovery "+p.Token+" rebuilt the cluster from")
	assert.Contains(t, err.Error(), "a failed boot loses the cluster")
	// `agent recover` on cp-0: a one-member cluster with a new ID.
	pool.mu.Lock()
	pool.clusterID, pool.members, pool.clusters = "5eed", []string{"etcd-0"}, map[string]string{}
	pool.mu.Unlock()
	require.NoError(t, r.hub.SetPaused(ctx, false, "alice", ""))
	// Quorum is back (one of one): the dead machines are held whatever their verdict (the evidence is
	// judged afresh; Suspect or Unhealthy).
	for _, name := range []string{"cp-1", "cp-2"} {
		require.Eventually(t, func() bool { return r.machine(name).NeedsOperator == pass.NeedRetired }, 10*time.Second, 10*time.Millisecond, name)
		m := r.machine(name)
		assert.NotEqual(t, assess.VerdictHealthy, m.Verdict)
		assert.Contains(t, m.Decision, "retired by etcd recovery "+p.Token)
	}
	r.awaitPasses(t, 5)
	for _, name := range []string{"cp-1", "cp-2"} {
		assert.Equal(t, "Off", r.sim.PowerState(name), "%s: the hub does not power it on", name)
	}
	// The rebuilt cluster, reached by cp-0 and both witnesses (3 of the 5 judges) since the rebuild:
	// its survivor is held no longer, and the journal says so for the next hub.
	require.Eventually(t, func() bool {
		rec, err := r.hub.cfg.Recoveries.Recovery(ctx)
		return err == nil && rec != nil && rec.SurvivorSeen != nil
	}, 10*time.Second, 10*time.Millisecond)
	assert.Contains(t, strings.Join(r.hub.Timeline(), "\n"), "a strict majority of the observers reach etcd-0 since the rebuild; cp-0 is held as its survivor no longer")

	// cp-1 alone would run 1 of the old 3: no quorum. Not in the new membership, the quorum check
	// has nothing to say, so it takes --force.
	_, err = r.hub.Reboot(ctx, operator.RebootRequest{Machine: "cp-1"})
	require.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), "retired by etcd recovery "+p.Token+": its disk may still hold etcd-1 of the old cluster")
	assert.Contains(t, err.Error(), "`hub reboot cp-1 --force`", "the hold says how it is powered on")
	// Both asked for at once, their BMC slow to answer (a power-on under way while the machine still
	// reads Off): one is begun, the other refused (both were accepted, and came on: a chaos run under
	// load).
	r.sim.SetFaults(bmcsim.Faults{Latency: time.Second})
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, name := range []string{"cp-1", "cp-2"} {
		wg.Go(func() { _, errs[i] = r.hub.Reboot(ctx, operator.RebootRequest{Machine: name, Force: true}) })
	}
	wg.Wait()
	r.sim.SetFaults(bmcsim.Faults{})
	on, off := 1, 2
	if errs[0] != nil {
		on, off = 2, 1
		errs[0], errs[1] = errs[1], errs[0]
	}
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrRefused)
	assert.Contains(t, errs[1].Error(), fmt.Sprintf("cp-%d (etcd-%d): remediation ", on, on))
	assert.Contains(t, errs[1].Error(), "2 of the old cluster's members would run, its quorum (2)")
	onName, offName := fmt.Sprintf("cp-%d", on), fmt.Sprintf("cp-%d", off)
	require.Eventually(t, func() bool { return r.sim.PowerState(onName) == "On" }, 10*time.Second, 10*time.Millisecond)
	pool.mu.Lock()
	pool.clusters[onName] = testClusterID // it boots its old member
	pool.mu.Unlock()
	pool.restart(onName)

	// The other with it: 2 of the old 3, the old quorum. Refused, --force or not.
	r.awaitPasses(t, 3)
	for _, force := range []bool{false, true} {
		_, err = r.hub.Reboot(ctx, operator.RebootRequest{Machine: offName, Force: force})
		require.ErrorIs(t, err, ErrRefused)
		assert.Contains(t, err.Error(), fmt.Sprintf("cp-%d (etcd-%d): its agent reports", on, on))
		assert.Contains(t, err.Error(), "2 of the old cluster's members would run, its quorum (2)")
	}
	assert.Equal(t, "Off", r.sim.PowerState(offName))

	// `agent rejoin` on the first: in the new cluster, no longer retired; the other may come on.
	pool.mu.Lock()
	pool.clusters[onName], pool.members = "5eed", []string{"etcd-0", fmt.Sprintf("etcd-%d", on)}
	pool.mu.Unlock()
	r.awaitPasses(t, 3)
	assert.Empty(t, r.machine(onName).NeedsOperator)
	_, err = r.hub.Reboot(ctx, operator.RebootRequest{Machine: offName, DryRun: true})
	require.ErrorIs(t, err, ErrRefused, "its member is in no membership the quorum check knows")
	assert.Contains(t, err.Error(), fmt.Sprintf("`hub reboot %s --force`: it is in no membership the quorum check knows), then run `agent rejoin` on it", offName))

	// Seen back, it is journaled so. When it hangs later (its reports gone, its member unreachable:
	// nothing live says it rejoined), it is healed, not held as retired again (a full run on the real
	// cluster: a machine rejoined after a recovery hung minutes later, and was held for good).
	require.Eventually(t, func() bool {
		rec, err := r.hub.cfg.Recoveries.Recovery(ctx)
		if err != nil || rec == nil {
			return false
		}
		_, back := rec.Rejoined[fmt.Sprintf("etcd-%d", on)]
		return back
	}, 10*time.Second, 10*time.Millisecond)
	assert.Contains(t, strings.Join(r.hub.Timeline(), "\n"), fmt.Sprintf("%s is back in the new etcd cluster as etcd-%d: retired by etcd recovery %s no more", onName, on, p.Token))
	require.Eventually(t, func() bool { return r.machine(onName).Remediation == nil }, 10*time.Second, 10*time.Millisecond, "the operator's power-on done")
	pool.mu.Lock()
	pool.dead[onName] = true
	pool.mu.Unlock()
	require.Eventually(t, func() bool { return r.machine(onName).Verdict == assess.VerdictUnhealthy }, 20*time.Second, 10*time.Millisecond)
	r.awaitPasses(t, 3)
	m := r.machine(onName)
	assert.Empty(t, m.NeedsOperator)
	assert.Contains(t, m.Decision, "cooling down", "held only by the cooldown after the operator's power-on")
	_, err = r.hub.Reboot(ctx, operator.RebootRequest{Machine: onName, DryRun: true})
	assert.NoError(t, err, "an operator's reboot of it is admitted")
	assert.Equal(t, pass.NeedRetired, r.machine(offName).NeedsOperator, "the other is still retired")
}

// A remediation the hub decided before a recovery's pause, journaled only after the recovery began
// (the pass's begins are journaled beside the passes), is overtaken by the recovery all the same: it
// ends while the hub is still paused, and its machine, retired, is not powered on when the operator
// resumes (a loaded run: such a remediation waited at its checkpoint for the resume, then would have
// gone on to power on a member whose disk holds the old cluster).
func TestARemediationJournaledAfterTheRecoveryBeganIsOvertaken(t *testing.T) {
	late := make(chan struct{})
	r, pool := lossRig(t, func(r *passRig) { r.journal.late = late })
	ctx := t.Context()
	r.loseTwo(t, 0)
	r.reporting()
	require.NoError(t, r.hub.SetSuspended(ctx, false, "alice", ""))
	var begun []string
	require.Eventually(t, func() bool {
		begun = begun[:0]
		for _, name := range []string{"cp-1", "cp-2"} {
			if _, ok := r.hub.flightOf(name); ok {
				begun = append(begun, name)
			}
		}
		return len(begun) > 0
	}, 10*time.Second, 10*time.Millisecond, "a remediation decided, its journal write held")
	_, err := r.hub.Recover(ctx, operator.RecoverRequest{ConfirmLost: []string{"cp-1", "cp-2"}})
	require.NoError(t, err)
	rec, err := r.hub.cfg.Recoveries.Recovery(ctx)
	require.NoError(t, err)
	close(late) // journaled now, after the recovery began
	for _, name := range begun {
		require.Eventually(t, func() bool { _, ok := r.hub.flightOf(name); return !ok }, 10*time.Second, 10*time.Millisecond,
			"%s: its remediation ends, the hub still paused", name)
		h, err := r.journal.History(ctx, name)
		require.NoError(t, err)
		require.NotEmpty(t, h, name)
		last := h[len(h)-1]
		assert.Equal(t, journal.Aborted, last.State, name)
		assert.True(t, last.Created.After(rec.Began), "%s: journaled after the recovery began", name)
	}
	pool.mu.Lock()
	pool.clusterID, pool.members, pool.clusters = "5eed", []string{"etcd-0"}, map[string]string{}
	pool.mu.Unlock()
	require.NoError(t, r.hub.SetPaused(ctx, false, "alice", ""))
	r.awaitPasses(t, 10)
	for _, name := range []string{"cp-1", "cp-2"} {
		assert.Equal(t, "Off", r.sim.PowerState(name), "%s: fenced by the recovery, not powered on after it", name)
		assert.Equal(t, pass.NeedRetired, r.machine(name).NeedsOperator, name)
	}
}

func TestRetirementHold(t *testing.T) {
	now := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	rec := &pass.RecoveryRecord{Plan: pass.RecoveryPlan{Loss: &pass.QuorumLoss{Voters: 5, Quorum: 3},
		Rebuild: quorum.Rebuild{Token: "hale-old-1", Survivor: &quorum.Survivor{Member: "etcd-4", Machine: "cp-4", ClusterID: "old"},
			Fence: []quorum.FenceStep{{Machine: "cp-0", Member: "etcd-0"}, {Machine: "cp-1", Member: "etcd-1"}, {Member: "etcd-9"}}},
		Candidates: []quorum.Survivor{{Member: "etcd-4", Machine: "cp-4"}, {Member: "etcd-3", Machine: "cp-3"}}}}
	r := pass.RetirementOf(rec)
	assert.Equal(t, 3, r.Quorum)
	assert.Equal(t, []pass.Retiree{{Machine: "cp-0", Member: "etcd-0"}, {Machine: "cp-1", Member: "etcd-1"}, {Machine: "cp-3", Member: "etcd-3"}}, r.Members,
		"the survivor is not retired, nor a lost member without a machine")
	back := *rec
	back.Rejoined = map[string]time.Time{"etcd-1": now}
	assert.Equal(t, []pass.Retiree{{Machine: "cp-0", Member: "etcd-0"}, {Machine: "cp-3", Member: "etcd-3"}}, pass.RetirementOf(&back).Members,
		"one journaled back in the new cluster is retired no more")
	report := func(node, member, cluster string, age time.Duration) health.Report {
		return health.Report{Node: node, SentAt: now.Add(-age), Etcd: &health.EtcdView{LocalName: member, ClusterID: cluster}}
	}
	for _, tc := range []struct {
		name    string
		machine string
		reports []health.Report
		want    string // "" not held
		// dead: the senders are dead in the hub's gossip (alive otherwise).
		dead bool
	}{
		{"not seen", "cp-0", nil, "retired by etcd recovery hale-old-1", false},
		{"its member back in the new cluster", "cp-0", []health.Report{report("cp-0", "etcd-0", "new", time.Second)}, "", false},
		{"back in the new cluster, its agent (restarted by the rejoin) still dead in the hub's gossip", "cp-0",
			[]health.Report{report("cp-0", "etcd-0", "new", time.Second)}, "", true},
		{"its member in the old cluster", "cp-3", []health.Report{report("cp-3", "etcd-3", "old", time.Second)}, "cp-3 still runs etcd-3, a member of the old etcd cluster old", false},
		{"the old cluster in the last report of an agent dead in the hub's gossip", "cp-3", []health.Report{report("cp-3", "etcd-3", "old", time.Second)},
			"retired by etcd recovery hale-old-1: its disk may still hold etcd-3", true},
		{"a report too old to say it rejoined", "cp-0", []health.Report{report("cp-0", "etcd-0", "new", time.Hour)}, "retired by etcd recovery", false},
		{"another member's report", "cp-0", []health.Report{report("cp-1", "etcd-1", "new", time.Second)}, "retired by etcd recovery", false},
		{"no cluster ID yet (the member is starting)", "cp-0", []health.Report{report("cp-0", "etcd-0", "", time.Second)}, "retired by etcd recovery", false},
		{"the survivor", "cp-4", nil, "", false},
		{"a machine of no recovery", "cp-7", nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := assess.Observations{Now: now, Reports: map[string]health.Report{}, HubPeers: map[string]health.PeerView{}}
			for _, rep := range tc.reports {
				obs.Reports[rep.Node] = rep
				obs.HubPeers[rep.Node] = health.PeerView{Name: rep.Node, State: health.PeerAlive}
				if tc.dead {
					obs.HubPeers[rep.Node] = health.PeerView{Name: rep.Node, State: health.PeerDead}
				}
			}
			h, held := r.Hold(tc.machine, obs, 10*time.Second)
			assert.Equal(t, tc.want != "", held)
			if held {
				assert.Contains(t, h.Why, tc.want)
				assert.Equal(t, pass.ReasonRetired, h.Reason)
				assert.Equal(t, pass.NeedRetired, h.Need)
			}
		})
	}
	assert.Equal(t, pass.Retirement{}, pass.RetirementOf(nil))

	// What a pass that cannot agree on a membership adds to why.
	old := assess.Observations{Now: now, Reports: map[string]health.Report{"cp-3": report("cp-3", "etcd-3", "old", time.Second)},
		HubPeers: map[string]health.PeerView{"cp-3": {Name: "cp-3", State: health.PeerAlive}}}
	assert.Equal(t, "; cp-3 (etcd-3) still run the old etcd cluster old that recovery hale-old-1 replaced, and report its membership: run `agent rejoin` on them",
		r.RunningOld(old, 10*time.Second))
	assert.Empty(t, r.RunningOld(assess.Observations{Now: now}, 10*time.Second))
}

// `hub recover --yes` with a power-cycle under way: the hub waits for its BMC operation (here the
// power-on of a machine whose power supply is dead: its BMC reads it Off until the verify timeout), as
// long as such an operation may take, and then fences. A caller that gives up before leaves no pause
// and no token behind; the next call begins the recovery.
func TestRecoverWaitsForABMCOperationUnderWay(t *testing.T) {
	r, _ := lossRig(t, func(r *passRig) {
		r.hub.cfg.BMC.VerifyTimeout = 3 * time.Second
		r.hub.cfg.PowerFor = func(m pass.Machine) (execute.Power, error) { return r.hub.cfg.BMCPower(m) }
	})
	ctx := t.Context()
	r.loseTwo(t, 0)
	for _, name := range []string{"cp-1", "cp-2"} {
		r.sim.SetDead(name, true)
	}
	r.reporting()
	require.NoError(t, r.hub.SetSuspended(ctx, false, "alice", ""))
	busy := func() bool {
		for _, name := range []string{"cp-1", "cp-2"} {
			if rem := r.machine(name).Remediation; rem != nil && rem.Busy {
				return true
			}
		}
		return false
	}
	require.Eventually(t, busy, 10*time.Second, 10*time.Millisecond, "a power-cycle inside its BMC operation")
	confirm := operator.RecoverRequest{ConfirmLost: []string{"cp-1", "cp-2"}, By: "alice"}

	// Given up after 300 ms: refused, nothing left behind.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := r.hub.Recover(short, confirm)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "is still inside power-cycle")
	assert.Equal(t, operator.Running, r.hub.Status(ctx).Pause, "the pause it set is lifted")
	rec, err := r.hub.cfg.Recoveries.Recovery(ctx)
	require.NoError(t, err)
	assert.Nil(t, rec, "nothing journaled")

	// Waited for: it ends, then the recovery begins and fences both. A pause an earlier `hub recover
	// --yes` left (its hub killed while it waited) is adopted, with its token.
	require.Eventually(t, busy, 10*time.Second, 10*time.Millisecond, "a power-cycle inside its BMC operation again")
	left := "hale-" + testClusterID + "-42"
	require.NoError(t, r.hub.SetPaused(ctx, true, "alice", recoveryplan.PauseReason(left)))
	began := time.Now()
	p, err := r.hub.Recover(ctx, confirm)
	require.NoError(t, err)
	assert.Equal(t, left, p.Token)
	t.Logf("the recovery began %v after it was asked for, the power-cycle under way ended first", time.Since(began).Round(10*time.Millisecond))
	for _, f := range p.Fence {
		assert.True(t, f.Fenced, f.Machine)
		assert.Equal(t, "Off", r.sim.PowerState(f.Machine))
	}
	rec, err = r.hub.cfg.Recoveries.Recovery(ctx)
	require.NoError(t, err)
	require.NotNil(t, rec)
	assert.Equal(t, p.Token, rec.Plan.Token)
	assert.Equal(t, operator.Paused, r.hub.Status(ctx).Pause)
}

// failingRecoveries is a recovery journal that cannot be read once failing is set.
type failingRecoveries struct {
	RecoveryStore
	failing atomic.Bool
}

func (f *failingRecoveries) Recovery(ctx context.Context) (*pass.RecoveryRecord, error) {
	if f.failing.Load() {
		return nil, errors.New("journal.db: input/output error")
	}
	return f.RecoveryStore.Recovery(ctx)
}

// A recovery journal that cannot be read is no fresh start: the plan says it is blocked on it (a
// recovery may be under way), as Recover refuses.
func TestRecoveryPlanBlockedOnAnUnreadableJournal(t *testing.T) {
	var store *failingRecoveries
	r, _ := lossRig(t, func(r *passRig) {
		store = &failingRecoveries{RecoveryStore: r.hub.cfg.Recoveries}
		r.hub.cfg.Recoveries = store
	})
	r.loseTwo(t, 50)
	ctx := t.Context()
	before := r.hub.RecoveryPlan(ctx).Blockers
	store.failing.Store(true)
	p := r.hub.RecoveryPlan(ctx)
	require.Len(t, p.Blockers, len(before)+1, "%q", p.Blockers)
	assert.Contains(t, p.Blockers[len(before)], "the journal could not say whether an etcd recovery is already under way (journal.db: input/output error)")
	_, err := r.hub.Recover(ctx, operator.RecoverRequest{ConfirmLost: []string{"cp-1", "cp-2"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "input/output error")
}
