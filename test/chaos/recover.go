package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/test/lab"
)

// command is one of an operator's commands: what it is (the timeline's op-end says "what: answer"),
// on which machine, its command line, and how to run it (its output; its error's text when it fails).
type command struct {
	what, target string
	args         []string
	run          func() (string, error)
}

// recoverAll is the operator's whole recovery after a permanent loss of etcd's quorum, as
// docs/operating.md has it: once the hub says the quorum is lost for good, `hub recover --yes` (the
// plan, the fence), `agent recover` on the survivor, `hub resume`, then each lost machine replaced
// (an empty disk), powered on with `hub reboot --force` and brought back with `agent rejoin`, one at
// a time; the second is also tried early, before the first has rejoined, which the hub must refuse.
// A step that fails is run again every 2 s (the faults kill the hub) until deadline.
func (in *injector) recoverAll(ctx context.Context, deadline time.Time) {
	c := in.c
	in.tl.add("op-start", "", opRecoverAll)
	done := func(verdict string) { in.tl.add("op-end", "", opRecoverAll+": "+verdict) }
	for !in.chk.saysForGood() {
		if time.Now().After(deadline) || !sleepUntil(ctx, time.Now().Add(time.Second)) {
			done("failed: the hub never said etcd's quorum is lost for good")
			return
		}
	}
	hubCmd := func(target string, args ...string) command {
		return command{what: args[0], target: target, args: args, run: func() (string, error) {
			out, err := c.HubOutput(ctx, args...)
			if err != nil {
				return err.Error(), err
			}
			return out, nil
		}}
	}
	out, ok := in.until(ctx, deadline, hubCmd("", "recover", "--yes", "-o", "json"))
	if !ok {
		done("failed: hub recover --yes")
		return
	}
	var plan pass.RecoveryPlan
	if err := json.Unmarshal([]byte(out), &plan); err != nil || plan.Survivor == nil || plan.Survivor.Machine == "" {
		done(fmt.Sprintf("failed: the plan names no survivor's machine (%v): %s", err, firstLine(out)))
		return
	}
	planFile := c.Write("recovery-plan.json", out)
	survivor := c.Machine(plan.Survivor.Machine)
	agentCmd := func(m *lab.Machine, verb string, extra ...string) command {
		args := append([]string{verb, "--plan", planFile, "--manifest", m.Manifest, "--state-dir", m.StateDir,
			"--etcd-endpoint", "http://" + m.Host.Addr(2379)}, extra...)
		return command{what: "agent-" + verb, target: m.Name, args: append([]string{"agent"}, args...), run: func() (string, error) {
			return m.Host.Run(append([]string{c.Bins.Agent}, args...)...)
		}}
	}
	steps := []command{agentCmd(survivor, "recover"), hubCmd("", "resume")}
	for i, f := range plan.Fence {
		m := c.Machine(f.Machine)
		steps = append(steps, command{what: "replace", target: m.Name, args: []string{"replace", m.Name}, run: func() (string, error) { m.Replace(); return "", nil }},
			hubCmd(m.Name, "reboot", m.Name, "--force", "--yes"))
		if i == 0 && len(plan.Fence) > 1 {
			// The next one too, before this one has rejoined: the hub must refuse (run once).
			next := c.Machine(plan.Fence[1].Machine)
			early := hubCmd(next.Name, "reboot", next.Name, "--force", "--yes")
			steps = append(steps, command{what: "replace", target: next.Name, args: []string{"replace", next.Name}, run: func() (string, error) {
				next.Replace()
				in.record(early)
				return "", nil
			}})
		}
		steps = append(steps, agentCmd(m, "rejoin", "--cluster", "http://"+survivor.Host.Addr(2379)))
	}
	for _, s := range steps {
		if _, ok := in.until(ctx, deadline, s); !ok {
			done("failed: " + s.what)
			return
		}
	}
	done("ok")
}

// until runs an operator's command again every 2 s until it succeeds or deadline passes, and returns
// its output.
func (in *injector) until(ctx context.Context, deadline time.Time, cmd command) (string, bool) {
	for {
		out, ok := in.record(cmd)
		if ok || time.Now().After(deadline) || !sleepUntil(ctx, time.Now().Add(2*time.Second)) {
			return out, ok
		}
	}
}

// awaitPlanning waits, for at most d, until the hub's latest status says it plans: an operator reads
// `hub status` before `hub recover`. On a loaded machine a hub may miss a majority of its observers
// for a moment (far-side, beside the real clusters: 3 of 6 heard when it was asked, so its refusal
// said "does not plan", not the one the schedule exists to show); a hub that never hears one
// (minority-hub) is asked all the same once d has passed.
func (chk *checker) awaitPlanning(ctx context.Context, d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		chk.mu.Lock()
		planning := chk.planning
		chk.mu.Unlock()
		if planning || !sleepUntil(ctx, time.Now().Add(500*time.Millisecond)) {
			return
		}
	}
}

// saysForGood: the hub's latest status said etcd's quorum is lost for good.
func (chk *checker) saysForGood() bool {
	chk.mu.Lock()
	defer chk.mu.Unlock()
	return chk.forGood
}
