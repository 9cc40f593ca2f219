// Package demo is the demo's scenarios and the hub's end-to-end tests. A scenario is a story with the
// ending it must reach, narrated on the cluster's timeline, run on a Rig: test/lab's in-process cluster
// (cmd/hale-demo, TestScenarios) or, for those that need no more than a Rig says, its namespace lab's
// real processes (test/lab's TestScenariosOnRealProcesses).
package demo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/lab/inproc"
)

// Scenario is one story the demo tells, with the ending it must reach.
type Scenario struct {
	Name  string
	Title string
	Run   func(ctx context.Context, r Rig) error
	// InProcessOnly: it needs more than a Rig says (the hub's inventory, the BMC simulator's faults,
	// the etcd members' recovery), so it runs on the in-process cluster alone.
	InProcessOnly bool
}

// Scenarios returns the demo's scenarios, in the order they run.
func Scenarios() []Scenario {
	return []Scenario{
		{"stall", "one machine stops answering for a second, then goes on by itself → Unhealthy, held within its stall tolerance → back: nothing is done", stallScenario, false},
		{"hang", "one machine hangs → detected → its stall tolerance passes → power-cycled → rejoins", hangScenario, false},
		{"panic", "one machine panics: its BMC logs an OS critical stop → the hang is proved → power-cycled at once", panicScenario, false},
		{"quorum-lost", "two of three machines hang (quorum lost); the hub, cp-0 and two witnesses are 4 of 6 observers → both dead members power-cycled → quorum restored", quorumLostScenario, false},
		{"quorum-lost-no-witness", "the same without witnesses: the hub and cp-0 are 2 of 4 observers, no majority → held and explained; an operator's forced reboot brings them back", quorumLostNoWitnessScenario, true},
		{"partition", "the hub and cp-0 cut off from cp-1, cp-2 and both witnesses → the hub hears 2 of 6: nothing is done; the partition heals → all healthy, no BMC call", partitionScenario, false},
		{"refused-reboot", "a manual reboot of a healthy member while another is down → refused with the reason", refusedRebootScenario, false},
		{"pause", "pause while a remediation is in flight → Pausing until its BMC step is done, then Paused", pauseScenario, true},
		{"permanent-loss", "two of three machines die for good (power and disks) → quorum lost FOR GOOD on the BMCs' word → hub recover: the plan, " +
			"then --yes: fenced → agent recover on cp-0: a new one-member cluster, every key kept, revisions bumped → replacements powered on one at a time " +
			"(a second refused while the first could run the old cluster) and rejoined → three healthy members", permanentLossScenario, true},
	}
}

// Select returns the scenarios named (all when names is empty), or an error naming the unknown one.
func Select(names []string) ([]Scenario, error) {
	all := Scenarios()
	if len(names) == 0 {
		return all, nil
	}
	var out []Scenario
	for _, n := range names {
		i := slices.IndexFunc(all, func(s Scenario) bool { return s.Name == n })
		if i < 0 {
			var known []string
			for _, s := range all {
				known = append(known, s.Name)
			}
			return nil, fmt.Errorf("no scenario %q; known: %s", n, strings.Join(known, ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}

func hangScenario(ctx context.Context, r Rig) error {
	before := takeSnapshot(r)
	t0 := time.Now()
	r.Hang(2)
	if err := r.WaitFor(ctx, 60*time.Second, r.Name(2)+"'s remediation to succeed", succeeded(r, before, 2)); err != nil {
		return err
	}
	if err := r.WaitFor(ctx, 30*time.Second, "every machine Healthy", r.AllHealthy); err != nil {
		return err
	}
	r.Say("demo", "%s hung → healed and healthy again in %v", r.Name(2), time.Since(t0).Round(time.Millisecond))
	return expectResets(r, before, [machines]int{0, 0, 1})
}

func stallScenario(ctx context.Context, r Rig) error {
	before := takeSnapshot(r)
	r.Hang(2)
	// A second at least; until the hub calls it Unhealthy (on a loaded machine detection takes longer),
	// within 2.5 s, short of its stall tolerance at this pace (4 s).
	hung, unhealthy := time.Now(), false
	for time.Since(hung) < time.Second || time.Since(hung) < 2500*time.Millisecond && !unhealthy {
		unhealthy = unhealthy || machineStatus(ctx, r, r.Name(2)).Verdict == assess.VerdictUnhealthy
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	r.Resume(2)
	// Its etcd member catches up (seconds after a longer stall), and a loaded machine's gossip takes a
	// while to hear every member again.
	if err := r.WaitFor(ctx, 60*time.Second, "every machine Healthy", r.AllHealthy); err != nil {
		return err
	}
	if unhealthy {
		if err := r.WaitFor(ctx, 10*time.Second, r.Name(2)+"'s episode, resumed", func() bool {
			e, ok := lastEpisode(r, 2)
			return ok && e.Outcome == pass.EpisodeResumed && e.Ended.After(hung)
		}); err != nil {
			return err
		}
		e, _ := lastEpisode(r, 2)
		r.Say("demo", "%s came back by itself after %v without a sign of life: nothing was done", r.Name(2), e.Length().Round(100*time.Millisecond))
	} else {
		r.Say("demo", "%s came back by itself after %v, before the hub called it Unhealthy: nothing was done", r.Name(2), time.Since(hung).Round(100*time.Millisecond))
	}
	if n, _ := r.Remediations(2); n != before.remediations[2] {
		return fmt.Errorf("%s: %d remediations begun, want none", r.Name(2), n-before.remediations[2])
	}
	return expectResets(r, before, [machines]int{})
}

func panicScenario(ctx context.Context, r Rig) error {
	before := takeSnapshot(r)
	t0 := time.Now()
	r.Panic(1)
	if err := r.WaitFor(ctx, 60*time.Second, r.Name(1)+"'s remediation to succeed", succeeded(r, before, 1)); err != nil {
		return err
	}
	if err := r.WaitFor(ctx, 30*time.Second, "every machine Healthy", r.AllHealthy); err != nil {
		return err
	}
	e, ok := lastEpisode(r, 1)
	if !ok || e.Outcome != pass.EpisodeProved {
		return fmt.Errorf("%s's last episode: %+v, want one acted on the BMC's proof", r.Name(1), e)
	}
	r.Say("demo", "%s panicked → proved by its BMC, healed and healthy again in %v (%s)", r.Name(1), time.Since(t0).Round(time.Millisecond), e.Grounds)
	return expectResets(r, before, [machines]int{0, 1, 0})
}

func quorumLostScenario(ctx context.Context, r Rig) error {
	before := takeSnapshot(r)
	t0 := time.Now()
	hangTogether(r, 1, 2)
	for _, i := range []int{1, 2} {
		if err := r.WaitFor(ctx, 60*time.Second, fmt.Sprintf("%s's remediation to succeed", r.Name(i)), succeeded(r, before, i)); err != nil {
			return err
		}
	}
	if err := r.WaitFor(ctx, 30*time.Second, "every machine Healthy", r.AllHealthy); err != nil {
		return err
	}
	r.Say("demo", "quorum lost → restored, every machine healthy in %v", time.Since(t0).Round(time.Millisecond))
	return expectResets(r, before, [machines]int{0, 1, 1})
}

func quorumLostNoWitnessScenario(ctx context.Context, r Rig) error {
	tb, err := inProcessOnly(r, "quorum-lost-no-witness")
	if err != nil {
		return err
	}
	h := tb.Hub()
	inv, err := tb.Inventory()
	if err != nil {
		return err
	}
	full := inv
	inv.Witnesses = nil
	tb.Say("demo", "the hub's inventory now lists no witness: its expected observers are the 3 agents and itself")
	if err := h.SetInventory(inv); err != nil {
		return err
	}
	defer func() { _ = h.SetInventory(full) }()
	before := takeSnapshot(r)
	hangTogether(r, 1, 2)
	if err := expectNothing(ctx, r, 4*time.Second, before, "the hub hears 2 of 4 expected observers"); err != nil {
		return err
	}
	a, _ := h.Assessment(inproc.Name(2))
	tb.Say("demo", "held: %s is %s: %s", inproc.Name(2), a.Verdict, strings.Join(a.Reasons, "; "))
	tb.Say("demo", "the hub says: not planning: %s", h.Status(ctx).NotPlanning)
	for _, i := range []int{1, 2} {
		tb.Say("demo", "operator: hub reboot %s --force (the evidence above is the operator's to weigh)", inproc.Name(i))
		res, err := h.Reboot(ctx, operator.RebootRequest{Machine: inproc.Name(i), Force: true, By: "demo"})
		if err != nil {
			return fmt.Errorf("a forced reboot of %s: %w", inproc.Name(i), err)
		}
		tb.Say("demo", "forced over: %s", res.Overrides)
	}
	for _, i := range []int{1, 2} {
		if err := tb.WaitFor(ctx, 60*time.Second, fmt.Sprintf("%s's forced reboot to succeed", inproc.Name(i)), succeeded(r, before, i)); err != nil {
			return err
		}
	}
	if err := h.SetInventory(full); err != nil {
		return err
	}
	if err := tb.WaitFor(ctx, 30*time.Second, "every machine Healthy", tb.AllHealthy); err != nil {
		return err
	}
	return expectResets(r, before, [machines]int{0, 1, 1})
}

func partitionScenario(ctx context.Context, r Rig) error {
	before := takeSnapshot(r)
	minority := []string{r.HubName(), r.Name(0)}
	majority := []string{r.Name(1), r.Name(2), r.Witness(0), r.Witness(1)}
	r.Partition(minority, majority)
	healed := false
	defer func() {
		if !healed {
			r.Heal()
		}
	}()
	if err := expectNothing(ctx, r, 6*time.Second, before, "the hub hears 2 of 6 expected observers"); err != nil {
		return err
	}
	m := machineStatus(ctx, r, r.Name(2))
	r.Say("demo", "%s is %s on the hub's side: %s", m.Name, m.Verdict, strings.Join(m.Reasons, "; "))
	st, err := r.Status(ctx)
	if err != nil {
		return err
	}
	r.Say("demo", "the hub says: not planning: %s", st.NotPlanning)
	r.Heal()
	healed = true
	t0 := time.Now()
	if err := r.WaitFor(ctx, 60*time.Second, "every machine Healthy after the heal", r.AllHealthy); err != nil {
		return err
	}
	r.Say("demo", "partition healed → every machine healthy again in %v, nothing rebooted", time.Since(t0).Round(time.Millisecond))
	return expectResets(r, before, [machines]int{})
}

func refusedRebootScenario(ctx context.Context, r Rig) error {
	before := takeSnapshot(r)
	// Detach the machine first so that it stays down while the operator tries the reboot.
	down, healthy := r.Name(2), r.Name(0)
	if err := r.SetDetached(ctx, down, true, "demo", "keep "+down+" down while the operator tries a reboot"); err != nil {
		return err
	}
	r.Hang(2)
	if err := r.WaitFor(ctx, 30*time.Second, down+" Unhealthy", func() bool {
		return machineStatus(ctx, r, down).Verdict == assess.VerdictUnhealthy
	}); err != nil {
		return err
	}
	r.Say("demo", "operator: hub reboot %s (a healthy member, while %s is down)", healthy, down)
	// Asked again while the hub refuses it for another reason (a loaded run: no fresh etcd view for a
	// moment, or every member's view so stale that quorum looks lost already), as an operator told so
	// would: those refusals are not the one this scenario shows. An admission ends it at once: with
	// cp-2 down, rebooting a healthy member costs quorum.
	var err error
	if werr := r.WaitFor(ctx, 30*time.Second, "a refusal on quorum's own terms", func() bool {
		_, err = r.Reboot(ctx, operator.RebootRequest{Machine: healthy, By: "demo"})
		return err == nil || strings.Contains(err.Error(), "quorum needs 2")
	}); werr != nil {
		return fmt.Errorf("rebooting %s with %s down: %w (last: %v)", healthy, down, werr, err)
	}
	if !errors.Is(err, hub.ErrRefused) || !strings.Contains(err.Error(), "quorum needs 2") {
		return fmt.Errorf("rebooting %s with %s down: want a refusal that names quorum, got %v", healthy, down, err)
	}
	r.Say("demo", "the hub says: %v", err)
	r.Say("demo", "operator: hub reboot %s --dry-run (the member that is down)", down)
	res, err := r.Reboot(ctx, operator.RebootRequest{Machine: down, DryRun: true})
	if err != nil {
		return fmt.Errorf("a dry-run reboot of the dead member: want a plan, got %w", err)
	}
	r.Say("demo", "allowed (free: %s is not a healthy voter): %s", down, strings.Join(res.Steps, " → "))
	r.Say("demo", "operator: hub attach %s", down)
	if err := r.SetDetached(ctx, down, false, "demo", ""); err != nil {
		return err
	}
	if err := r.WaitFor(ctx, 60*time.Second, down+"'s remediation to succeed", succeeded(r, before, 2)); err != nil {
		return err
	}
	if err := r.WaitFor(ctx, 30*time.Second, "every machine Healthy", r.AllHealthy); err != nil {
		return err
	}
	return expectResets(r, before, [machines]int{0, 0, 1})
}

func pauseScenario(ctx context.Context, r Rig) error {
	tb, err := inProcessOnly(r, "pause")
	if err != nil {
		return err
	}
	h := tb.Hub()
	before := takeSnapshot(r)
	tb.Say("demo", "the BMC gets slow (every request takes 300 ms), so the power step takes a while")
	tb.Sim().SetFaults(bmcsim.Faults{Latency: 300 * time.Millisecond})
	defer tb.Sim().SetFaults(bmcsim.Faults{})
	tb.Hang(1)
	busy := func() bool {
		for _, m := range h.Status(context.Background()).Machines {
			if m.Name == inproc.Name(1) && m.Remediation != nil && m.Remediation.Busy {
				return true
			}
		}
		return false
	}
	if err := tb.WaitFor(ctx, 30*time.Second, "cp-1's BMC step to start", busy); err != nil {
		return err
	}
	tb.Say("demo", "operator: hub pause --wait (a BMC step is in flight)")
	if err := h.SetPaused(ctx, true, "demo", "a maintenance window"); err != nil {
		return err
	}
	if st := h.PauseState(); st != operator.Pausing {
		return fmt.Errorf("paused during a BMC step: state %s, want Pausing", st)
	}
	tb.Say("demo", "pause state: %s", operator.Pausing)
	t0 := time.Now()
	if err := tb.WaitFor(ctx, 30*time.Second, "the pause to be acknowledged", func() bool { return h.PauseState() == operator.Paused }); err != nil {
		return err
	}
	tb.Say("demo", "pause state: %s after %v: the BMC step finished and nothing new starts", operator.Paused, time.Since(t0).Round(time.Millisecond))
	tb.Sim().SetFaults(bmcsim.Faults{})
	tb.Say("demo", "operator: hub resume")
	if err := h.SetPaused(ctx, false, "demo", ""); err != nil {
		return err
	}
	if err := tb.WaitFor(ctx, 60*time.Second, "cp-1's remediation to succeed", succeeded(r, before, 1)); err != nil {
		return err
	}
	if err := tb.WaitFor(ctx, 30*time.Second, "every machine Healthy", tb.AllHealthy); err != nil {
		return err
	}
	return expectResets(r, before, [machines]int{0, 1, 0})
}

// Run runs scenarios in order on r (its hub started), settling before each. It returns one error
// per failed scenario; a scenario's failure does not stop the next.
func Run(ctx context.Context, r Rig, scenarios []Scenario) error {
	var errs []error
	for n, s := range scenarios {
		if err := r.Settle(ctx); err != nil {
			return errors.Join(append(errs, fmt.Errorf("before scenario %s: %w", s.Name, err))...)
		}
		r.Say("demo", "━━ scenario %d/%d %s: %s", n+1, len(scenarios), s.Name, s.Title)
		if err := s.Run(ctx, r); err != nil {
			r.Say("demo", "✗ scenario %s FAILED: %v", s.Name, err)
			errs = append(errs, fmt.Errorf("scenario %s: %w", s.Name, err))
			continue
		}
		r.Say("demo", "✓ scenario %s passed", s.Name)
	}
	return errors.Join(errs...)
}

func permanentLossScenario(ctx context.Context, r Rig) error {
	tb, err := inProcessOnly(r, "permanent-loss")
	if err != nil {
		return err
	}
	h := tb.Hub()
	before := takeSnapshot(r)
	const key = "demo/written-before-the-loss"
	written, err := tb.Put(ctx, key, "kept")
	if err != nil {
		return err
	}
	tb.Say("demo", "written to etcd: %s at revision %d", key, written)
	lost := make(chan error, 1)
	go func() { lost <- tb.LoseForGood(1) }()
	if err := errors.Join(tb.LoseForGood(2), <-lost); err != nil {
		return err
	}
	if err := tb.WaitFor(ctx, time.Minute, "quorum lost for good", func() bool {
		l := h.Status(ctx).QuorumLoss
		return l != nil && l.ForGood
	}); err != nil {
		return err
	}
	tb.Say("demo", "operator: hub recover (the plan; nothing is changed)")
	plan := h.RecoveryPlan(ctx)
	if plan.Survivor == nil || plan.Survivor.Machine != inproc.Name(0) || len(plan.Blockers) > 0 {
		return fmt.Errorf("the recovery plan: want cp-0 as the survivor and no blocker, got:\n%s", plan)
	}
	tb.Say("hub", "survivor %s (%s) at raft index %d; data at risk: %d entries; revision bump %d", plan.Survivor.Member, plan.Survivor.Machine,
		plan.Survivor.Index, plan.DataAtRisk, plan.BumpRevision)
	for _, f := range plan.Fence {
		tb.Say("hub", "fence %s (%s): %s", f.Machine, f.Member, f.How)
	}
	tb.Say("demo", "operator: hub recover --yes")
	t0 := time.Now()
	if plan, err = h.Recover(ctx, operator.RecoverRequest{By: "demo"}); err != nil {
		return fmt.Errorf("hub recover --yes: %w", err)
	}
	for _, i := range []int{1, 2} {
		if st := tb.Sim().PowerState(inproc.Name(i)); st != bmcsim.Off {
			return fmt.Errorf("%s not fenced: its BMC reads %s", inproc.Name(i), st)
		}
	}
	tb.Say("hub", "recovery %s journaled, the hub paused, cp-1 and cp-2 fenced (read back Off) in %v", plan.Token, time.Since(t0).Round(time.Millisecond))
	tb.Say("demo", "operator on cp-0: agent recover --plan plan.json")
	if _, err := tb.RecoverOn(ctx, 0, plan); err != nil {
		return fmt.Errorf("agent recover on cp-0: %w", err)
	}
	rebuilt := time.Since(t0)
	value, rev, err := tb.Get(ctx, 0, key)
	switch {
	case err != nil:
		return err
	case value != "kept" || rev < written+int64(plan.BumpRevision):
		return fmt.Errorf("after the recovery: %s = %q at revision %d, want %q at a revision of at least %d", key, value, rev, "kept", written+int64(plan.BumpRevision))
	}
	tb.Say("demo", "etcd answers again %v after hub recover --yes: %s is there, the revision went from %d to %d, never back", rebuilt.Round(time.Millisecond), key, written, rev)

	tb.Say("demo", "operator: hub resume")
	if err := h.SetPaused(ctx, false, "demo", ""); err != nil {
		return err
	}
	if err := tb.WaitFor(ctx, 30*time.Second, "cp-1 and cp-2 held as retired", func() bool {
		st := h.Status(ctx)
		return st.Machines[1].NeedsOperator == pass.NeedRetired && st.Machines[2].NeedsOperator == pass.NeedRetired
	}); err != nil {
		return err
	}
	tb.Say("hub", "cp-1: %s", machineStatus(ctx, r, inproc.Name(1)).Decision)

	// Grow back, one machine at a time: a replacement started with the old cluster's flags tries to
	// join the old cluster; two of them would be its quorum.
	for n, i := range []int{1, 2} {
		tb.Replace(i)
		tb.Say("demo", "operator: hub reboot %s --force (powers it on)", inproc.Name(i))
		if _, err := h.Reboot(ctx, operator.RebootRequest{Machine: inproc.Name(i), Force: true, By: "demo"}); err != nil {
			return fmt.Errorf("powering %s on: %w", inproc.Name(i), err)
		}
		if err := tb.WaitFor(ctx, 30*time.Second, inproc.Name(i)+" powered on", func() bool { return tb.Sim().PowerState(inproc.Name(i)) == bmcsim.On }); err != nil {
			return err
		}
		if n == 0 {
			tb.Replace(2)
			tb.Say("demo", "operator: hub reboot cp-2 --force (before cp-1 has rejoined)")
			_, err := h.Reboot(ctx, operator.RebootRequest{Machine: inproc.Name(2), Force: true, By: "demo"})
			if !errors.Is(err, hub.ErrRefused) || !strings.Contains(err.Error(), "quorum") {
				return fmt.Errorf("powering cp-2 on while cp-1 runs outside the new cluster: want a refusal, got %v", err)
			}
			tb.Say("hub", "refused: %v", err)
		}
		tb.Say("demo", "operator on %s: agent rejoin --plan plan.json --cluster %s", inproc.Name(i), tb.EtcdEndpoint(0))
		if _, err := tb.RejoinOn(ctx, i, 0, plan); err != nil {
			return fmt.Errorf("agent rejoin on %s: %w", inproc.Name(i), err)
		}
		// Its agent's next reports show it in the new cluster: the hub lets it go from then on.
		if err := tb.WaitFor(ctx, 30*time.Second, inproc.Name(i)+" a healthy voter of the new cluster", func() bool {
			for _, m := range h.Status(ctx).Machines {
				if m.Name == inproc.Name(i) {
					return m.Role == "voter" && m.EtcdHealth == quorum.Healthy.String() && m.NeedsOperator == ""
				}
			}
			return false
		}); err != nil {
			return err
		}
		tb.Say("hub", "%s: %s", inproc.Name(i), machineStatus(ctx, r, inproc.Name(i)).Decision)
	}
	if err := tb.WaitFor(ctx, time.Minute, "every machine Healthy", tb.AllHealthy); err != nil {
		return err
	}
	tb.Say("demo", "three healthy members again %v after hub recover --yes", time.Since(t0).Round(time.Millisecond))
	if got := len(tb.Resets(0)) - before.resets[0]; got != 0 {
		return fmt.Errorf("the survivor cp-0 got %d power actions", got)
	}
	return nil
}
