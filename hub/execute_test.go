package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

func members(desc string) quorum.Cluster {
	var c quorum.Cluster
	for i, r := range desc {
		h := quorum.Healthy
		if r == 'D' {
			h = quorum.Unhealthy
		}
		c.Members = append(c.Members, quorum.Member{Name: "etcd-" + string(rune('0'+i)), Health: h})
	}
	return c
}

type execRig struct {
	sim     *bmcsim.Server
	power   *bmc.Controller
	path    string
	journal *boltfile.File
}

func newExecRig(t *testing.T) *execRig {
	t.Helper()
	sim, err := bmcsim.Start(bmcsim.Config{Username: "admin", Password: "pw", PlainHTTP: true,
		Systems: []bmcsim.SystemConfig{{ID: "1", ShutdownDelay: 30 * time.Millisecond, CycleOffDuration: 30 * time.Millisecond}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sim.Close() })
	ep, err := bmc.ParseEndpoint(sim.Endpoint())
	require.NoError(t, err)
	power, err := bmc.New(ep, bmc.NewCredentials("admin", "pw"), bmc.Options{PollInterval: 10 * time.Millisecond, VerifyTimeout: 5 * time.Second, GracefulTimeout: 2 * time.Second})
	require.NoError(t, err)
	r := &execRig{sim: sim, power: power, path: filepath.Join(t.TempDir(), "journal.db")}
	r.journal = openJournal(t, r.path)
	t.Cleanup(func() { _ = r.journal.Close() })
	return r
}

// testWorld is a remediation's world for the executor's tests: a fixed membership (or live), the
// machine back when the simulated BMC shows it reset and on (or recovered), no other evidence, and
// the journal trouble it was told.
type testWorld struct {
	live                          func(context.Context) (quorum.Cluster, error)
	barrier                       func(context.Context) error
	wanted                        error
	overtaken                     error
	overtakenFrom, overtakenAsked int
	cameBack                      func(context.Context) bool
	evidence                      func(context.Context, time.Time) (bool, string)
	trouble                       []string
	records                       []journal.Entry
}

func (w *testWorld) Live(ctx context.Context) (quorum.Cluster, error) { return w.live(ctx) }
func (w *testWorld) Gate(context.Context) error                       { return nil }
func (w *testWorld) Wanted() error                                    { return w.wanted }
func (w *testWorld) Overtaken() error {
	// overtaken from the overtakenFrom-th question on (the first is take's, at the checkpoint)
	if w.overtakenAsked++; w.overtakenAsked < w.overtakenFrom {
		return nil
	}
	return w.overtaken
}
func (w *testWorld) CameBack(ctx context.Context) bool {
	return w.cameBack != nil && w.cameBack(ctx)
}

func (w *testWorld) Barrier(ctx context.Context) error {
	if w.barrier == nil {
		return nil
	}
	return w.barrier(ctx)
}

func (w *testWorld) ResetEvidence(ctx context.Context, since time.Time) (bool, string) {
	if w.evidence == nil {
		return false, ""
	}
	return w.evidence(ctx, since)
}

func (w *testWorld) Recorded(rec journal.Entry, err error) {
	if err != nil {
		w.trouble = append(w.trouble, err.Error())
		return
	}
	w.records = append(w.records, rec)
}

func (r *execRig) executor(live quorum.Cluster) *execute.Executor {
	return &execute.Executor{Journal: r.journal, Policy: quorum.DefaultPolicy(), PollInterval: 10 * time.Millisecond, ComeBackTimeout: 5 * time.Second,
		LiveWait: 300 * time.Millisecond, // a refusal that stands ends the remediation this much later
		World:    &testWorld{live: func(context.Context) (quorum.Cluster, error) { return live, nil }, cameBack: r.cameBack}}
}

func worldOf(e *execute.Executor) *testWorld { return e.World.(*testWorld) }

// cameBack: the simulated machine is on and has been reset at least once.
func (r *execRig) cameBack(context.Context) bool {
	return r.sim.PowerState("1") == "On" && len(r.sim.Resets("1")) > 0
}

func (r *execRig) begin(t *testing.T, plan quorum.Plan) journal.Remediation {
	t.Helper()
	rem, err := r.journal.Begin(t.Context(), journal.Remediation{Machine: "cp-2", Strategy: plan.Strategy.String(), RequestedBy: "hub", Reason: "test", Steps: plan.Steps})
	require.NoError(t, err)
	return rem
}

func TestExecutorReboots(t *testing.T) {
	r := newExecRig(t)
	live := members("HHH")
	plan, err := live.PlanReboot(quorum.DefaultPolicy(), "etcd-2")
	require.NoError(t, err)
	rem := r.begin(t, plan)
	require.NoError(t, r.executor(live).Run(context.Background(), rem, plan, 0, r.power))
	assert.Equal(t, []string{"GracefulRestart"}, r.sim.Resets("1"))
	h := mustGet(t, r.journal, "cp-2")
	assert.Equal(t, journal.Succeeded, h.State)
	var kinds []string
	for _, ev := range h.History {
		kinds = append(kinds, string(ev.Kind))
	}
	assert.Equal(t, []string{"note", "intent", "outcome", "outcome", "note"}, kinds, "intent before the BMC call, outcome after")
}

func TestExecutorRechecksQuorumBeforeActing(t *testing.T) {
	r := newExecRig(t)
	plan, err := members("HHH").PlanReboot(quorum.DefaultPolicy(), "etcd-2")
	require.NoError(t, err)
	rem := r.begin(t, plan)
	// Between planning and acting, another member died: rebooting a healthy one now costs quorum.
	err = r.executor(members("DHH")).Run(context.Background(), rem, plan, 0, r.power)
	require.ErrorContains(t, err, "re-check before power-cycle etcd-2 refused: rebooting etcd-2 leaves 1 of 3 voters healthy; quorum needs 2")
	assert.Empty(t, r.sim.Resets("1"), "no BMC call")
	assert.Equal(t, journal.Aborted, mustGet(t, r.journal, "cp-2").State)
}

// A membership that cannot be known now (too few observers report it) is asked for again for
// LiveWait before the re-check gives up: the step goes on once it is known and the check passes;
// it never goes on unknown, and a remediation no longer wanted meanwhile ends.
func TestExecutorWaitsForAMembershipItCannotKnowYet(t *testing.T) {
	unknown := errors.New("only 1 of the 5 expected agents and witnesses that read etcd report the etcd membership (3 needed)")
	for _, tc := range []struct {
		name     string
		known    func(ask int) bool // whether the membership is known at the ask-th Live call
		refused  func(ask int) bool // whether it is then one that refuses the step (nil: never)
		wanted   error              // from the second wait on
		resets   int
		state    journal.State
		wantsErr string
	}{
		{name: "known at the third ask: the step goes on", known: func(ask int) bool { return ask >= 3 }, resets: 1, state: journal.Succeeded},
		{name: "never known: aborted after LiveWait", known: func(int) bool { return false }, resets: 0, state: journal.Aborted, wantsErr: unknown.Error()},
		{name: "the machine came back meanwhile: aborted", known: func(int) bool { return false }, wanted: errors.New("cp-2 is Healthy again"), resets: 0,
			state: journal.Aborted, wantsErr: "Healthy again"},
		// Asked again just before the request goes out (the second ask), too.
		{name: "known at the re-check, not as the request goes out, again at the fourth ask: sent", known: func(ask int) bool { return ask == 1 || ask >= 4 },
			resets: 1, state: journal.Succeeded},
		{name: "known at the re-check, never again: withdrawn after LiveWait", known: func(ask int) bool { return ask == 1 }, resets: 0,
			state: journal.Aborted, wantsErr: "the quorum check cannot be made again"},
		// A moment's view that refuses the step (etcd-0 down, etcd-2 up: rebooting etcd-2 would lose
		// quorum), as on a loaded machine whose members answer no status in time for a moment.
		{name: "refused at the re-check by a moment's view, then as planned: the step goes on", known: func(int) bool { return true },
			refused: func(ask int) bool { return ask < 3 }, resets: 1, state: journal.Succeeded},
		{name: "refused as the request goes out by a moment's view, then as planned: sent", known: func(int) bool { return true },
			refused: func(ask int) bool { return ask == 2 || ask == 3 }, resets: 1, state: journal.Succeeded},
		{name: "refused for good: aborted after LiveWait", known: func(int) bool { return true }, refused: func(int) bool { return true },
			resets: 0, state: journal.Aborted, wantsErr: "re-check before power-cycle etcd-2 refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newExecRig(t)
			plan, err := members("HHD").PlanReboot(quorum.DefaultPolicy(), "etcd-2")
			require.NoError(t, err)
			rem := r.begin(t, plan)
			e := r.executor(members("HHD"))
			e.LiveWait = 300 * time.Millisecond
			asked := 0
			w := worldOf(e)
			w.live = func(context.Context) (quorum.Cluster, error) {
				if asked++; asked > 2 && tc.wanted != nil {
					w.wanted = tc.wanted
				}
				if tc.known(asked) {
					if tc.refused != nil && tc.refused(asked) {
						return members("DHH"), nil
					}
					return members("HHD"), nil
				}
				return quorum.Cluster{}, unknown
			}
			err = e.Run(t.Context(), rem, plan, 0, r.power)
			assert.Len(t, r.sim.Resets("1"), tc.resets)
			assert.Equal(t, tc.state, mustGet(t, r.journal, "cp-2").State)
			if tc.wantsErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantsErr)
			assert.Greater(t, asked, 2, "asked again before giving up")
		})
	}
}

// What made a power step wanted and safe is asked again just before its BMC request goes out (seed
// 127 of test/chaos: the hub cut from the BMC for 5 s, the hung member answering again 0.5 s before
// the reset went out, and the hub, which had seen it Healthy, reset it all the same).
func TestExecutorWithdrawsARequestNoLongerWanted(t *testing.T) {
	recovered := errors.New("cp-2 is Healthy again")
	tests := []struct {
		name       string
		later      quorum.Cluster // the membership once the step was re-checked
		wanted     error
		overtaken  error
		force      bool
		wantResets int
		wantErr    string
	}{
		{name: "the dead member answers again before the request", later: members("HHH"), wantErr: "power-cycle etcd-2 would now disrupt a healthy voter"},
		{name: "the machine is Healthy again", later: members("HHD"), wanted: recovered, wantErr: "cp-2 is Healthy again"},
		{name: "another member died meanwhile", later: members("DHH"), wantErr: "rebooting etcd-2 leaves 1 of 3"},
		{name: "nothing changed: sent", later: members("HHD"), wantResets: 1},
		{name: "forced: the quorum part is not asked", later: members("HHH"), force: true, wantResets: 1},
		{name: "overtaken by an etcd recovery after the checkpoint, forced or not", later: members("HHD"), force: true,
			overtaken: errors.New("overtaken by etcd recovery hale-1"), wantErr: "overtaken by etcd recovery hale-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newExecRig(t)
			r.sim.SetFaults(bmcsim.Faults{Latency: 50 * time.Millisecond}) // the request goes out a while after the re-check
			plan, err := members("HHD").PlanReboot(quorum.DefaultPolicy(), "etcd-2")
			require.NoError(t, err)
			rem := r.begin(t, plan)
			e := r.executor(members("HHD"))
			calls := 0
			worldOf(e).live = func(context.Context) (quorum.Cluster, error) {
				if calls++; calls > 1 {
					return tt.later, nil
				}
				return members("HHD"), nil
			}
			worldOf(e).wanted, worldOf(e).overtaken, worldOf(e).overtakenFrom = tt.wanted, tt.overtaken, 2
			e.Force = tt.force
			err = e.Run(t.Context(), rem, plan, 0, r.power)
			assert.Len(t, r.sim.Resets("1"), tt.wantResets)
			got := mustGet(t, r.journal, "cp-2")
			if tt.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, journal.Succeeded, got.State)
				return
			}
			require.ErrorIs(t, err, bmc.ErrWithdrawn)
			assert.ErrorContains(t, err, tt.wantErr)
			assert.Equal(t, journal.Aborted, got.State, "aborted: the next pass decides afresh")
			require.True(t, got.Has(journal.ResultWithdrawn), "the journal says the request was not sent: %+v", got.History)
			assert.Equal(t, "On", r.sim.PowerState("1"))
		})
	}
}

// A remediation an etcd recovery overtakes (it retired the machine) ends Aborted, saying why: at its
// checkpoint, before any BMC request; or awaiting the machine's recovery, at once instead of waiting
// out its recovery timeout.
func TestExecutorOvertakenAtTheCheckpoint(t *testing.T) {
	r := newExecRig(t)
	plan, err := members("HHD").PlanReboot(quorum.DefaultPolicy(), "etcd-2")
	require.NoError(t, err)
	rem := r.begin(t, plan)
	e := r.executor(members("HHD"))
	worldOf(e).overtaken = errors.New("overtaken by etcd recovery hale-1")
	err = e.Run(t.Context(), rem, plan, 0, r.power)
	require.ErrorContains(t, err, "overtaken by etcd recovery hale-1")
	assert.Empty(t, r.sim.Resets("1"), "no BMC request")
	assert.Equal(t, journal.Aborted, mustGet(t, r.journal, "cp-2").State)
}

func TestExecutorAwaitOvertaken(t *testing.T) {
	r := newExecRig(t)
	plan, err := members("HHD").PlanReboot(quorum.DefaultPolicy(), "etcd-2")
	require.NoError(t, err)
	rem := r.begin(t, plan)
	e := r.executor(members("HHD"))
	w := worldOf(e)
	w.cameBack = func(context.Context) bool {
		w.overtaken = errors.New("overtaken by etcd recovery hale-1")
		return false
	}
	err = e.Run(t.Context(), rem, plan, 0, r.power)
	require.ErrorContains(t, err, "overtaken by etcd recovery hale-1")
	got := mustGet(t, r.journal, "cp-2")
	assert.Equal(t, journal.Aborted, got.State)
	assert.Contains(t, got.History[len(got.History)-1].Detail, "overtaken by etcd recovery hale-1")
}

// The hub dies between intent and outcome. The restarted hub (a new journal epoch) reads the BMC,
// sees the reset happened after the intent, does not repeat it, and finishes: exactly one power action.
func TestExecutorResumesWithoutRepeatingAPowerAction(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sentFirst bool // whether the dying hub got the BMC call out
	}{{"the call went out before the crash", true}, {"the hub died before the call", false}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newExecRig(t)
			live := members("HHD")
			plan, err := live.PlanReboot(quorum.DefaultPolicy(), "etcd-2")
			require.NoError(t, err)
			rem := r.begin(t, plan)
			require.NoError(t, r.journal.Intent(t.Context(), rem.ID, 0, "reboot etcd-2"))
			if tc.sentFirst {
				_, err := r.power.Reboot(context.Background())
				require.NoError(t, err)
			}
			require.NoError(t, r.journal.Close()) // crash

			r.journal = openJournal(t, r.path)
			active, err := r.journal.Active(t.Context())
			require.NoError(t, err)
			require.Len(t, active, 1)
			restored, err := execute.PlanOf(active[0])
			require.NoError(t, err)
			assert.Equal(t, plan.Steps, restored.Steps)
			e := r.executor(live)
			from, err := e.Resume(context.Background(), active[0], restored, r.power)
			require.NoError(t, err)
			if tc.sentFirst {
				assert.Equal(t, 1, from, "the reboot happened: go on with waiting")
			} else {
				assert.Equal(t, 0, from, "the reboot did not happen: take it again")
			}
			require.NoError(t, e.Run(context.Background(), active[0], restored, from, r.power))
			assert.Len(t, r.sim.Resets("1"), 1, "exactly one power action at the BMC: %v", r.sim.Resets("1"))
			h := mustGet(t, r.journal, "cp-2")
			assert.Equal(t, journal.Succeeded, h.State)
			joined := ""
			for _, ev := range h.History {
				joined += ev.Detail + "\n"
			}
			if tc.sentFirst {
				assert.Contains(t, joined, "after a hub restart: the BMC reports On, last reset at")
				assert.Contains(t, joined, "not repeated")
			} else {
				assert.True(t, strings.Contains(joined, "the step did not happen; taking it again"), joined)
			}
		})
	}
}

// The journal stores steps typed, written as text: a step that is not one does not read back.
func TestJournalStepsReadBackTyped(t *testing.T) {
	var rem journal.Remediation
	require.NoError(t, json.Unmarshal([]byte(`{"id":"cp-1/1","strategy":"reboot","steps":["power-cycle etcd-1","await-healthy etcd-1"]}`), &rem))
	plan, err := execute.PlanOf(rem)
	require.NoError(t, err)
	assert.Equal(t, []quorum.Step{{Op: quorum.OpPowerCycle, Member: "etcd-1"}, {Op: quorum.OpAwaitHealthy, Member: "etcd-1"}}, plan.Steps)
	assert.ErrorContains(t, json.Unmarshal([]byte(`{"steps":["explode etcd-1"]}`), &rem), `step "explode etcd-1": want an operation and a member`)
	_, err = execute.PlanOf(journal.Remediation{ID: "cp-1/2", Strategy: "nuke", Steps: plan.Steps})
	assert.ErrorContains(t, err, "remediation cp-1/2")
	_, err = execute.PlanOf(journal.Remediation{ID: "cp-1/3", Strategy: "reboot"})
	assert.ErrorContains(t, err, "remediation cp-1/3: no readable steps")
}

// fakeOwner counts hand-overs and withdrawals and says the machine is replaced after replacedAfter
// polls, or, with refusal set, answers that from the second poll on.
type fakeOwner struct {
	handOvers, polls, replacedAfter, withdrawals int
	refusal                                      string
}

func (o *fakeOwner) Describe() string { return "KubeadmControlPlane test/cp" }
func (o *fakeOwner) HandOver(context.Context, string, []quorum.Step) error {
	o.handOvers++
	return nil
}
func (o *fakeOwner) Progress(context.Context) (execute.OwnerProgress, string, error) {
	o.polls++
	switch {
	case o.refusal != "" && o.polls > 1:
		return execute.OwnerRefused, o.refusal, nil
	case o.polls > o.replacedAfter:
		return execute.OwnerDone, "replaced", nil
	}
	return execute.OwnerWorking, "waiting for the new machine", nil
}
func (o *fakeOwner) Remove(context.Context) error { return nil }
func (o *fakeOwner) Withdraw(context.Context) error {
	o.withdrawals++
	return nil
}

func TestExecutorHandsOverToTheOwner(t *testing.T) {
	opts := quorum.ReplaceOptions{NewMember: "etcd-2" + pass.NewMemberSuffix, Orders: []quorum.Order{quorum.ScaleDownFirst}, Join: quorum.JoinAsVoter}
	for _, tc := range []struct {
		name, live string
		want       journal.State
		handOvers  int
	}{
		{"dead member of three: handed over", "HHD", journal.Succeeded, 1},
		{"a second member down: the plan's remove would lose quorum, refused at the re-check", "HDD", journal.Aborted, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newExecRig(t)
			planned := members("HHD") // planned when only etcd-2 was down
			plan, err := planned.PlanReplace(quorum.DefaultPolicy(), "etcd-2", opts)
			require.NoError(t, err)
			rem := r.begin(t, plan)
			owner := &fakeOwner{replacedAfter: 2}
			e := r.executor(members(tc.live))
			e.Owner = owner
			err = e.Run(t.Context(), rem, plan, 0, nil)
			got := mustGet(t, r.journal, "cp-2")
			assert.Equal(t, tc.want, got.State, "journal: %+v", got.History)
			assert.Equal(t, tc.handOvers, owner.handOvers)
			if tc.want == journal.Succeeded {
				require.NoError(t, err)
				assert.Equal(t, len(plan.Steps), execute.NextStep(got), "the plan is closed")
			} else {
				require.ErrorContains(t, err, "refused")
			}
		})
	}
}

// An owner that refuses (KubeadmControlPlane's CannotBeRemediated) ends the remediation Failed with its
// answer at once, the hand-over withdrawn, instead of after the replace timeout.
func TestExecutorOwnerRefusal(t *testing.T) {
	r := newExecRig(t)
	live := members("HHD")
	plan, err := live.PlanReplace(quorum.DefaultPolicy(), "etcd-2", quorum.ReplaceOptions{NewMember: "etcd-2" + pass.NewMemberSuffix, Orders: []quorum.Order{quorum.ScaleDownFirst}})
	require.NoError(t, err)
	rem := r.begin(t, plan)
	owner := &fakeOwner{replacedAfter: 1 << 30, refusal: "KubeadmControlPlane can't remediate this machine because the operation already failed 3 times (MaxRetry)"}
	e := r.executor(live)
	e.Owner = owner
	e.ReplaceTimeout = time.Hour
	err = e.Run(t.Context(), rem, plan, 0, nil)
	require.ErrorContains(t, err, "KubeadmControlPlane test/cp refused to replace cp-2: KubeadmControlPlane can't remediate this machine because the operation already failed 3 times (MaxRetry)")
	got := mustGet(t, r.journal, "cp-2")
	assert.Equal(t, journal.Failed, got.State)
	assert.Contains(t, got.History[len(got.History)-1].Detail, "(MaxRetry)")
	assert.Equal(t, 1, owner.handOvers)
	assert.Equal(t, 1, owner.withdrawals)
	assert.Equal(t, 2, owner.polls, "no waiting after the answer")
}

func TestExecutorResumesAHandOver(t *testing.T) {
	r := newExecRig(t)
	live := members("HHD")
	plan, err := live.PlanReplace(quorum.DefaultPolicy(), "etcd-2", quorum.ReplaceOptions{NewMember: "etcd-2" + pass.NewMemberSuffix, Orders: []quorum.Order{quorum.ScaleDownFirst}})
	require.NoError(t, err)
	rem := r.begin(t, plan)
	// The hub died between the hand-over's intent and its outcome.
	require.NoError(t, r.journal.Intent(t.Context(), rem.ID, 0, "hand over"))
	rem = mustGet(t, r.journal, "cp-2")
	owner := &fakeOwner{}
	e := r.executor(live)
	e.Owner = owner
	from, err := e.Resume(t.Context(), rem, plan, nil)
	require.NoError(t, err)
	assert.Equal(t, 0, from, "signalled again: a hand-over is idempotent")
	require.NoError(t, e.Run(t.Context(), mustGet(t, r.journal, "cp-2"), plan, from, nil))
	assert.Equal(t, 1, owner.handOvers)

	// Resumed after the hand-over's outcome: the owner is waited for, not signalled again.
	rem2, err := r.journal.Begin(t.Context(), journal.Remediation{Machine: "cp-3", Strategy: "replace", RequestedBy: "hub", Steps: plan.Steps})
	require.NoError(t, err)
	require.NoError(t, r.journal.Intent(t.Context(), rem2.ID, 0, "hand over"))
	require.NoError(t, r.journal.Outcome(t.Context(), rem2.ID, 0, journal.ResultHandedOver, "handed over to "+owner.Describe()))
	rem2 = mustGet(t, r.journal, "cp-3")
	from, err = e.Resume(t.Context(), rem2, plan, nil)
	require.NoError(t, err)
	require.NoError(t, e.Run(t.Context(), rem2, plan, from, nil))
	assert.Equal(t, 1, owner.handOvers)
	assert.Equal(t, journal.Succeeded, mustGet(t, r.journal, "cp-3").State)
}

// A machine that is not an etcd member (a worker, a control-plane node without a member): there is no
// quorum to check, and its steps are not refused for naming no member.
func TestExecutorRebootsAMachineThatIsNotAMember(t *testing.T) {
	r := newExecRig(t)
	plan := pass.MachinePlan(quorum.Reboot, pass.Machine{MachineRef: assess.MachineRef{Name: "worker-1"}})
	rem := r.begin(t, plan)
	e := r.executor(members("HHH"))
	require.ErrorContains(t, e.Run(t.Context(), rem, plan, 0, r.power), "no member named worker-1",
		"without NotAMember the quorum check refuses a step on a member that does not exist")
	rem = r.begin(t, plan)
	e.NotAMember = true
	require.NoError(t, e.Run(t.Context(), rem, plan, 0, r.power))
	assert.Equal(t, journal.Succeeded, mustGet(t, r.journal, "cp-2").State)
	assert.Equal(t, []string{"GracefulRestart"}, r.sim.Resets("1"))
}

// surgeOwner scales up first: working, then ready for the old machine to go, then (once removed) done.
type surgeOwner struct {
	fakeOwner
	removes int
}

func (o *surgeOwner) Progress(context.Context) (execute.OwnerProgress, string, error) {
	o.polls++
	switch {
	case o.removes > 0:
		return execute.OwnerDone, "old machine gone", nil
	case o.polls > 2:
		return execute.OwnerReadyToRemove, "replacement ready", nil
	}
	return execute.OwnerWorking, "waiting for the replacement", nil
}
func (o *surgeOwner) Remove(context.Context) error {
	o.removes++
	return nil
}

// Scale up first: the plan's remove is its own journaled step, taken once the owner's replacement is
// ready, after a re-check; a hub restarted after it does not take it again.
func TestExecutorSurgeRemovesTheOldMachineAsAStep(t *testing.T) {
	r := newExecRig(t)
	live := members("HHH")
	plan, err := live.PlanReplace(quorum.DefaultPolicy(), "etcd-2", quorum.ReplaceOptions{NewMember: "etcd-2" + pass.NewMemberSuffix, Orders: []quorum.Order{quorum.ScaleUpFirst}, Join: quorum.JoinAsLearner})
	require.NoError(t, err)
	require.Equal(t, quorum.OpRemove, plan.Steps[len(plan.Steps)-1].Op)
	rem := r.begin(t, plan)
	owner := &surgeOwner{}
	e := r.executor(live)
	e.Owner = owner
	require.NoError(t, e.Run(t.Context(), rem, plan, 0, nil))
	assert.Equal(t, 1, owner.handOvers)
	assert.Equal(t, 1, owner.removes)
	got := mustGet(t, r.journal, "cp-2")
	assert.Equal(t, journal.Succeeded, got.State)
	var steps []string
	for _, ev := range got.History {
		if ev.Kind == journal.EntryIntent {
			steps = append(steps, fmt.Sprintf("%d", ev.Step))
		}
	}
	assert.Equal(t, []string{"0", fmt.Sprint(len(plan.Steps) - 1)}, steps, "two intents: the hand-over, then the remove")

	// Resumed after the remove's outcome, the owner still saying ready for a moment: not removed again.
	last := len(plan.Steps) - 1
	rem2, err := r.journal.Begin(t.Context(), journal.Remediation{Machine: "cp-3", Strategy: "replace", RequestedBy: "hub", Steps: plan.Steps})
	require.NoError(t, err)
	for _, ev := range []struct {
		step   int
		result journal.Result // "": an intent
		detail string
	}{{0, "", "hand over"}, {0, journal.ResultHandedOver, "handed over to x"}, {last, "", "remove"}, {last, journal.ResultOldRemoved, "old machine let go by x"}} {
		if ev.result == "" {
			require.NoError(t, r.journal.Intent(t.Context(), rem2.ID, ev.step, ev.detail))
		} else {
			require.NoError(t, r.journal.Outcome(t.Context(), rem2.ID, ev.step, ev.result, ev.detail))
		}
	}
	again := &lateOwner{}
	e.Owner = again
	resumed := mustGet(t, r.journal, "cp-3")
	from, err := e.Resume(t.Context(), resumed, plan, nil)
	require.NoError(t, err)
	require.NoError(t, e.Run(t.Context(), resumed, plan, from, nil))
	assert.Equal(t, journal.Succeeded, mustGet(t, r.journal, "cp-3").State)
	assert.Equal(t, 3, again.polls, "waited for the owner, not closed at once")
	assert.Equal(t, 0, again.removes)
	assert.Equal(t, 0, again.handOvers)
}

// lateOwner says ready-to-remove for two polls (its status lags), then done.
type lateOwner struct{ surgeOwner }

func (o *lateOwner) Progress(context.Context) (execute.OwnerProgress, string, error) {
	o.polls++
	if o.polls > 2 {
		return execute.OwnerDone, "old machine gone", nil
	}
	return execute.OwnerReadyToRemove, "replacement ready", nil
}

// noResetTime is a BMC that keeps no reset time (IPMI, metal3): operator.Status says On, or Off when off.
type noResetTime struct {
	execute.Power
	off bool
}

func (p noResetTime) Status(context.Context) (bmc.PowerState, time.Time, error) {
	if p.off {
		return bmc.PowerOff, time.Time{}, nil
	}
	return bmc.PowerOn, time.Time{}, nil
}

// After a crash between a reset's intent and its outcome, a BMC with no reset time cannot say whether
// the reset happened: Resume goes by the machine instead, and takes the step again only when nothing
// showed a reset within the window.
func TestResumeWithoutAResetTime(t *testing.T) {
	for _, tc := range []struct {
		name      string
		off       bool
		evidence  time.Duration // when the machine starts to show the reset, after Resume starts; <0: never
		intentAge time.Duration // how long before Resume the intent was written
		wantDone  bool
		want      string
	}{
		{"the agent restarted after the intent", false, 0, 0, true, "its agent restarted"},
		{"it shows a moment later", false, 300 * time.Millisecond, 0, true, "its agent restarted"},
		{"the BMC reports Off", true, -1, 0, true, "reports Off: the reset is under way"},
		{"no sign of a reset within the window", false, -1, 0, false, "showed no sign of one"},
		{"the window passed while the hub was down", false, time.Second, time.Hour, false, "showed no sign of one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newExecRig(t)
			plan, err := members("HHD").PlanReboot(quorum.DefaultPolicy(), "etcd-2")
			require.NoError(t, err)
			rem := r.begin(t, plan)
			require.NoError(t, r.journal.Intent(t.Context(), rem.ID, 0, "reboot etcd-2"))
			rem = mustGet(t, r.journal, "cp-2")
			rem.History[len(rem.History)-1].At = time.Now().Add(-tc.intentAge)
			intent, _ := rem.Pending()
			e := r.executor(members("HHD"))
			e.ResetWindow = time.Second
			start := time.Now()
			worldOf(e).evidence = func(_ context.Context, since time.Time) (bool, string) {
				require.Equal(t, intent.At, since)
				if tc.evidence >= 0 && time.Since(start) >= tc.evidence {
					return true, "its agent restarted at 12:00:01, after the intent"
				}
				return false, ""
			}
			worldOf(e).cameBack = nil
			from, err := e.Resume(t.Context(), rem, plan, noResetTime{Power: r.power, off: tc.off})
			require.NoError(t, err)
			if tc.wantDone {
				assert.Equal(t, 1, from, "the reset happened: on to the await")
			} else {
				assert.Equal(t, 0, from, "no sign of the reset: taken again")
			}
			assert.Contains(t, mustGet(t, r.journal, "cp-2").History[2].Detail, tc.want)
			assert.Empty(t, r.sim.Resets("1"), "Resume itself sends nothing")
		})
	}
}

// flakyStore refuses the first n writes of one kind (as an API server that is restarting would).
type flakyStore struct {
	journal.Store
	kind   journal.EntryKind
	refuse int
}

func (s *flakyStore) Outcome(ctx context.Context, id string, step int, result journal.Result, detail string) error {
	if s.kind == journal.EntryOutcome && s.refuse > 0 {
		s.refuse--
		return errors.New("etcdserver: leader changed")
	}
	return s.Store.Outcome(ctx, id, step, result, detail)
}

func (s *flakyStore) Finish(ctx context.Context, id string, state journal.State, detail string) error {
	if s.kind == journal.EntryNote && s.refuse > 0 {
		s.refuse--
		return errors.New("etcdserver: request timed out")
	}
	return s.Store.Finish(ctx, id, state, detail)
}

// A journal write that fails is retried until it is recorded, the remediation still running (the
// machine held), and said once when it fails and once when it went in: an outcome or an end that
// was dropped would leave the remediation in progress in the journal, blocking its machine.
func TestExecutorRetriesJournalWritesUntilRecorded(t *testing.T) {
	for _, kind := range []journal.EntryKind{journal.EntryOutcome, journal.EntryNote} {
		t.Run(string(kind), func(t *testing.T) {
			r := newExecRig(t)
			live := members("HHH")
			plan, err := live.PlanReboot(quorum.DefaultPolicy(), "etcd-2")
			require.NoError(t, err)
			rem := r.begin(t, plan)
			e := r.executor(live)
			e.Journal = &flakyStore{Store: r.journal, kind: kind, refuse: 3}
			require.NoError(t, e.Run(t.Context(), rem, plan, 0, r.power))
			assert.Equal(t, []string{"GracefulRestart"}, r.sim.Resets("1"), "one BMC call")
			assert.Equal(t, journal.Succeeded, mustGet(t, r.journal, "cp-2").State)
			w := worldOf(e)
			require.Len(t, w.trouble, 1, "said once when refused: %q", w.trouble)
			assert.Contains(t, w.trouble[0], "etcdserver")
			var kinds []string
			for _, rec := range w.records {
				kinds = append(kinds, fmt.Sprintf("%s %s %s", rec.Kind, rec.Result, rec.Ends))
			}
			assert.Equal(t, []string{"intent  ", "outcome Done ", "outcome Done ", "note  Succeeded"}, kinds,
				"each record told once, when the journal has it")
		})
	}
}

// A write that no retry can make succeed is not retried: another hub took over the journal.
func TestPersistGivesUpOnAStaleEpoch(t *testing.T) {
	calls := 0
	err := execute.Persist(t.Context(), nil, func(context.Context) error { calls++; return fmt.Errorf("journal x: %w", journal.ErrStaleEpoch) })
	require.ErrorIs(t, err, journal.ErrStaleEpoch)
	assert.Equal(t, 1, calls)
}

// A step that disrupts a healthy voter is checked once more after fresh reports (the barrier); one
// that costs nothing (a dead member) does not wait for them. A moment after the barrier in which the
// fresh reports cannot tell the membership is waited out (LiveWait), as before it.
func TestExecutorConfirmsACostlyStepWithFreshReports(t *testing.T) {
	for _, tc := range []struct {
		name       string
		live       string // before the barrier
		after      string // after it
		unknown    int    // membership reads after the barrier that cannot tell it
		barrierErr error
		wantErr    string
		barriers   int
	}{
		{name: "a dead member: free, no barrier", live: "HHD", after: "HHD", barriers: 0},
		{name: "a healthy one, confirmed", live: "HHH", after: "HHH", barriers: 1},
		{name: "a healthy one, the fresh reports tell the membership a moment later: confirmed", live: "HHH", after: "HHH", unknown: 3, barriers: 1},
		{name: "a healthy one, the fresh reports never tell it: refused", live: "HHH", after: "HHH", unknown: 1 << 30, barriers: 1,
			wantErr: "re-check before power-cycle etcd-2 refused: confirming the quorum check with fresh reports: only 1 of 5 observers report the membership"},
		{name: "a healthy one, no fresh reports: refused", live: "HHH", after: "HHH", barrierErr: errors.New("only 1 of the 3 reported"), barriers: 1,
			wantErr: "re-check before power-cycle etcd-2 refused: confirming the quorum check with fresh reports: only 1 of the 3 reported"},
		{name: "a healthy one, the fresh reports show another dead: refused", live: "HHH", after: "DHH", barriers: 1,
			wantErr: "re-check before power-cycle etcd-2 refused: confirming the quorum check with fresh reports: rebooting etcd-2 leaves 1 of 3 voters healthy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newExecRig(t)
			plan, err := members(tc.live).PlanReboot(quorum.DefaultPolicy(), "etcd-2")
			require.NoError(t, err)
			rem := r.begin(t, plan)
			e := r.executor(members(tc.live))
			barriers := 0
			worldOf(e).barrier = func(context.Context) error {
				barriers++
				reads := 0
				worldOf(e).live = func(context.Context) (quorum.Cluster, error) {
					if reads++; reads <= tc.unknown {
						return quorum.Cluster{}, errors.New("only 1 of 5 observers report the membership")
					}
					return members(tc.after), nil
				}
				return tc.barrierErr
			}
			worldOf(e).cameBack = func(context.Context) bool { return true }
			err = e.Run(t.Context(), rem, plan, 0, r.power)
			assert.Equal(t, tc.barriers, barriers)
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Len(t, r.sim.Resets("1"), 1)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			assert.Empty(t, r.sim.Resets("1"), "no BMC call")
			assert.Equal(t, journal.Aborted, mustGet(t, r.journal, "cp-2").State)
		})
	}
}
