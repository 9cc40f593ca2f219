package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hale-dev/hale/test/lab"
)

// Grace is how long the hub may go on acting on what it heard before a cut: its view of an observer
// is fresh for a few seconds after the observer's last report (the hub's StaleAfter, 5 s by default,
// plus memberlist's suspicion). Property 2 counts an action "while the hub could not hear a majority"
// when the processes and the rules kept it from a majority for at least this long before the action.
const Grace = 10 * time.Second

// Lag is how late the hub can know that a member recovered: its agents report every second and it
// decides every 200 ms. Property 2 calls a member power-cycled "while healthy" when it was healthy
// through the Lag before the action; one that came back within it (a hung etcd that resumed just as
// the hub acted on 10 s of failure, seed 24) is a race no observer-based healer can win, and is not
// counted.
const Lag = 2 * time.Second

// powerAction is one machine taken down by its BMC, and who asked.
type powerAction struct {
	At      time.Time
	Machine string
	// By: "hale", "operator" (a manual reboot, quorum-checked) or "operator --force".
	By string
}

// request is one state-changing request a BMC received.
type request struct {
	At              time.Time
	Machine, Detail string
}

// result is what a run did and what the checker found.
type result struct {
	Schedule schedule
	Faults   int
	Actions  []powerAction
	Requests int
	// KilledInStep counts the hub's deaths inside a BMC step (kill-hub-bmc faults that fired).
	KilledInStep int
	Checked      [7]int // actions (or windows, or the quiet period, or the hub's status, or samples) each property was checked on
	Violations   [7][]string
	// HealedIn: from the quiet period's start until every machine was healthy (0: not within the bound).
	HealedIn time.Duration
	// Held: machines not healthy at the bound that the hub holds, with its reason.
	Held []string
	// TradeOffs are Hale's power actions on a healthy voter that a partition had cut off from the hub
	// while the hub heard a majority of its expected observers: the other side held etcd's quorum,
	// this side held the observers' majority, and from here that looks exactly like the other side's
	// machines being dead (DESIGN rule 6, docs/design.md "Observers, witnesses and partitions": where the
	// witnesses are decides). Counted and shown, not failed; see docs/testing.md.
	TradeOffs []string
	// HubSees: at the end, the hub heard every expected observer and called every machine Healthy
	// (its own word; only the forger schedule's test asks).
	HubSees bool
	// Rejected are the gossip messages the hub refused, by reason (its /metrics at the run's end):
	// what a forger's reports and claims came to.
	Rejected map[string]int
	// Recoveries are the answers to the operator's `hub recover --yes` (recover faults), in order;
	// Operator every operator command's answer ("what: answer"), in order.
	Recoveries, Operator []string
	// Err is a harness failure (the run proves nothing).
	Err string
}

func (r result) passed() bool {
	if r.Err != "" {
		return false
	}
	for _, v := range r.Violations {
		if len(v) > 0 {
			return false
		}
	}
	return true
}

func (r result) count(by string) int {
	n := 0
	for _, a := range r.Actions {
		if a.By == by {
			n++
		}
	}
	return n
}

// evaluate checks properties 1 to 4, 6 and 7 against the samples, the power actions and the requests.
func evaluate(res *result, tl *timeline, samples []sample, machines []string, reqs []request) {
	events := tl.all()
	res.Actions = actionsOf(events)
	res.Requests = len(reqs)
	for _, e := range events {
		switch {
		case e.Kind == "fault" && strings.HasPrefix(e.Detail, "killed as "):
			res.KilledInStep++
		case e.Kind == "op-end":
			res.Operator = append(res.Operator, e.Detail)
		}
	}
	idx := func(name string) int { return slices.Index(machines, name) }
	before := func(t time.Time) (sample, bool) {
		i := sort.Search(len(samples), func(i int) bool { return !samples[i].At.Before(t) })
		if i == 0 || t.Sub(samples[i-1].At) > 1500*time.Millisecond {
			return sample{}, false
		}
		return samples[i-1], true
	}
	at := tl.since
	// 1: quorum, for Hale's actions and the operator's quorum-checked ones.
	for _, a := range res.Actions {
		if a.By == "operator --force" {
			continue
		}
		res.Checked[0]++
		s, ok := before(a.At)
		if !ok {
			res.Violations[0] = append(res.Violations[0], fmt.Sprintf("%s: %s powered off by %s with no sample of etcd just before it", at(a.At), a.Machine, a.By))
			continue
		}
		h, n, q := s.healthy(), s.healthyCount(), s.quorum()
		i := idx(a.Machine)
		if a.By == "hale" && h[i] && farSideBefore(samples, i, a.At) {
			res.TradeOffs = append(res.TradeOffs, fmt.Sprintf("%s: %s powered off by Hale, a healthy voter (%d of %d healthy) on the far side of a partition from the hub and a majority of its observers",
				at(a.At), a.Machine, n, s.Voters))
			continue
		}
		switch {
		case h[i] && n-1 < q && n >= q:
			res.Violations[0] = append(res.Violations[0], fmt.Sprintf("%s: %s powered off by %s took the healthy voters from %d to %d, below quorum (%d)", at(a.At), a.Machine, a.By, n, n-1, q))
		case h[i] && n < q:
			res.Violations[0] = append(res.Violations[0], fmt.Sprintf("%s: %s powered off by %s with quorum already lost: healthy voters %d → %d", at(a.At), a.Machine, a.By, n, n-1))
		}
	}
	// The operator's recovery after a permanent loss changes the membership; the checker reads it every
	// second, so a change it made may be seen up to the Lag after the recovery's end.
	var recovering bool
	var recovered time.Time
	for _, e := range events {
		switch {
		case e.Kind == "op-start" && e.Detail == opRecoverAll:
			recovering = true
		case e.Kind == "op-end" && strings.HasPrefix(e.Detail, opRecoverAll+":"):
			recovering, recovered = false, e.At
		case e.Kind == "membership" && !recovering && e.At.Sub(recovered) > Lag:
			res.Violations[0] = append(res.Violations[0], fmt.Sprintf("%s: the membership changed (%s); nothing in this lab changes it but an operator's recovery", at(e.At), e.Detail))
		}
	}
	// 2: no healthy member of a working quorum power-cycled by Hale; none while the hub could not hear a
	// majority of its expected observers.
	// Nor is one power-cycled again on the far side while it stayed there since its last cycle: the
	// first cycle did not bring it back into view, and a second proves nothing more (DESIGN rule 9).
	hale := slices.DeleteFunc(slices.Clone(res.Actions), func(a powerAction) bool { return a.By != "hale" })
	farSince := map[string]time.Time{} // a machine's last far-side power-off, while it stays on the far side
	for _, a := range hale {
		i := idx(a.Machine)
		if _, ok := before(a.At); ok && farSideBefore(samples, i, a.At) {
			if t, ok := farSince[a.Machine]; ok && farThrough(samples, i, t, a.At) {
				res.Violations[1] = append(res.Violations[1], fmt.Sprintf("%s: %s powered off by Hale again, on the far side of a partition since its last power-off at %s: "+
					"that one did not bring it back into view", at(a.At), a.Machine, at(t)))
			}
			farSince[a.Machine] = a.At
		} else {
			delete(farSince, a.Machine)
		}
	}
	for _, a := range hale {
		if slices.Contains(res.Schedule.Spare, a.Machine) {
			res.Violations[1] = append(res.Violations[1], fmt.Sprintf("%s: %s powered off by Hale, and no fault of the schedule made it sick", at(a.At), a.Machine))
		}
		res.Checked[1]++
		if s, ok := before(a.At); ok && healthyThrough(samples, idx(a.Machine), a.At.Add(-Lag), a.At) && s.healthyCount() >= s.quorum() && !farSideBefore(samples, idx(a.Machine), a.At) {
			res.Violations[1] = append(res.Violations[1], fmt.Sprintf("%s: %s powered off by Hale while a healthy voter of a working quorum (%d of %d healthy)",
				at(a.At), a.Machine, s.healthyCount(), s.Voters))
		}
		deaf, seen := true, 0
		for _, s := range samples {
			if s.At.After(a.At) || s.At.Before(a.At.Add(-Grace)) {
				continue
			}
			seen++
			deaf = deaf && !s.majority()
		}
		if deaf && seen > 0 {
			res.Violations[1] = append(res.Violations[1], fmt.Sprintf("%s: %s powered off by Hale while the hub could not hear a majority of its expected observers for %v before it",
				at(a.At), a.Machine, Grace))
		}
	}
	// 3: one power action per step: Hale never takes one machine down twice within the cooldown.
	last := map[string]time.Time{}
	for _, a := range hale {
		res.Checked[2]++
		if t, ok := last[a.Machine]; ok && a.At.Sub(t) < lab.Cooldown {
			res.Violations[2] = append(res.Violations[2], fmt.Sprintf("%s: %s powered off by Hale again %.1fs after the last time (cooldown %v)",
				at(a.At), a.Machine, a.At.Sub(t).Seconds(), lab.Cooldown))
		}
		last[a.Machine] = a.At
	}
	// 4: nothing sent to a detached machine, nor while paused (acknowledged) or suspended. The power-on
	// that ends an IPMI power cycle whose power-off went out before the brake is the rest of a step
	// taken before it, not an action taken under it: a machine is never left off in the middle of a
	// step (seed 1: the hub's cycle of cp-2 sent power 0, an operator's suspend took effect 0.1 s
	// later, and power 1 followed 0.9 s after the power 0). `hub suspend` and `hub detach` answer once no
	// step they hold is inside a BMC call (seed 1 on a loaded machine: the power 0 itself went out 0.1 s
	// after the suspend had answered, its step past the checkpoint before).
	for _, w := range brakeWindows(events) {
		res.Checked[3]++
		for _, r := range reqs {
			if r.At.After(w.from) && r.At.Before(w.to) && (w.machine == "" || w.machine == r.Machine) && !endsCycle(reqs, r, w.from) {
				res.Violations[3] = append(res.Violations[3], fmt.Sprintf("%s: %s's BMC got %s while %s (in force %s–%s)",
					at(r.At), r.Machine, r.Detail, w.what, at(w.from), at(w.to)))
			}
		}
	}
	// 6: unseen is not dead. The hub never says etcd's quorum is lost for good while a quorum of
	// members holds it (on the far side of a partition from the hub, say), through the Lag before, nor
	// carries out `hub recover --yes` (it fences) when no machine was confirmed lost.
	for _, e := range events {
		if e.Kind != "op-end" || !strings.HasPrefix(e.Detail, opRecover+": ") {
			continue
		}
		res.Checked[5]++
		res.Recoveries = append(res.Recoveries, strings.TrimPrefix(e.Detail, opRecover+": "))
		if e.Detail == opRecover+": ok" {
			if s, ok := before(e.At); !ok || quorumThrough(samples, e.At.Add(-Lag), e.At) {
				res.Violations[5] = append(res.Violations[5], fmt.Sprintf("%s: the hub carried out `hub recover --yes`, confirming nobody lost, while %d of %d voters held etcd's quorum",
					at(e.At), s.healthyCount(), s.Voters))
			}
		}
	}
	for _, s := range samples {
		if !s.HubRead {
			continue
		}
		res.Checked[5]++
		if s.ForGood && quorumThrough(samples, s.At.Add(-Lag), s.At) {
			res.Violations[5] = append(res.Violations[5], fmt.Sprintf("%s: the hub says etcd's quorum is lost for good while %d of %d voters hold it",
				at(s.At), s.healthyCount(), s.Voters))
		}
	}
	oneCluster(res, samples, at)
}

// oneCluster is property 7: never two etcd clusters serving at once. In every sample the members
// that answer and follow a leader are of one cluster: an old member started again on its old data,
// or two of them on empty disks with their old flags (two of three are the old quorum), would serve
// the old cluster beside the one rebuilt from the survivor.
func oneCluster(res *result, samples []sample, at func(time.Time) string) {
	for _, s := range samples {
		res.Checked[6]++
		clusters := map[uint64][]int{}
		for i, m := range s.Members {
			if m.Up && m.OK && m.Leader != 0 {
				clusters[m.Cluster] = append(clusters[m.Cluster], i)
			}
		}
		if len(clusters) > 1 {
			res.Violations[6] = append(res.Violations[6], fmt.Sprintf("%s: %d etcd clusters serve at once (members by cluster: %v)", at(s.At), len(clusters), clusters))
		}
	}
}

// quorumThrough: a quorum of healthy voters in every sample from from to to (and at least one).
func quorumThrough(samples []sample, from, to time.Time) bool {
	seen := false
	for _, s := range samples {
		if s.At.Before(from) || s.At.After(to) {
			continue
		}
		if s.healthyCount() < s.quorum() {
			return false
		}
		seen = true
	}
	return seen
}

// cycleBound is how long after an IPMI power-off the power-on of the same cycle comes (the BMC client
// sends it as soon as it reads Off; ipmitool's calls are bounded to 10 s each).
const cycleBound = 30 * time.Second

// endsCycle: r is a power-on that ends a power cycle of its machine: the request to that machine
// just before it is a power-off, sent before the brake (from), at most cycleBound before r.
func endsCycle(reqs []request, r request, from time.Time) bool {
	if r.Detail != "IPMI power 1" {
		return false
	}
	var last request
	for _, o := range reqs {
		if o.Machine == r.Machine && o.At.Before(r.At) && o.At.After(last.At) {
			last = o
		}
	}
	return last.Detail == "IPMI power 0" && last.At.Before(from) && r.At.Sub(last.At) <= cycleBound
}

// farSide: machine i was cut off from the hub while the hub heard a majority of its observers.
func farSide(s sample, i int) bool { return i < len(s.CutFromHub) && s.CutFromHub[i] && s.majority() }

// farSideBefore: machine i was on the far side (farSide) at a sample within the Grace before at, and
// cut off from the hub from then to at. The hub acts on what it heard, and learns that it lost its
// majority only as its observers' reports go stale (the Grace, as property 2's deafness counts it): a
// second partition that took its majority away 0.2 s (seed 1, 2026-12-02) or, on a starved machine,
// 2.2 s (seed 1, 2026-12-04) before it acted on the first is the first one's trade-off. A machine
// that came back into the hub's view in between is not.
func farSideBefore(samples []sample, i int, at time.Time) bool {
	for _, s := range samples {
		if !s.At.After(at) && !s.At.Before(at.Add(-Grace)) && farSide(s, i) && farThrough(samples, i, s.At, at) {
			return true
		}
	}
	return false
}

// farThrough: machine i was cut off from the hub in every sample from from to to.
func farThrough(samples []sample, i int, from, to time.Time) bool {
	for _, s := range samples {
		if !s.At.Before(from) && !s.At.After(to) && (i >= len(s.CutFromHub) || !s.CutFromHub[i]) {
			return false
		}
	}
	return true
}

// actionsOf finds the power actions in the events: every power-off is a BMC's (the faults kill
// processes, never the power; but a machine lost for good, whose power supply fails); it is the
// operator's when an operator's reboot of that machine was under way.
func actionsOf(events []event) []powerAction {
	type window struct {
		from  time.Time
		force bool
	}
	open := map[string]window{}
	var out []powerAction
	for _, e := range events {
		switch {
		case e.Kind == "op-start" && strings.HasPrefix(e.Detail, "reboot "):
			open[e.Target] = window{e.At, strings.Contains(e.Detail, "--force")}
		case e.Kind == "op-end" && strings.HasPrefix(e.Detail, "reboot:"):
			delete(open, e.Target)
		case e.Kind == "power-off" && e.Detail != lab.LostForGood:
			a := powerAction{At: e.At, Machine: e.Target, By: "hale"}
			if w, ok := open[e.Target]; ok {
				a.By = "operator"
				if w.force {
					a.By = "operator --force"
				}
			}
			out = append(out, a)
		}
	}
	return out
}

type brakeWindow struct {
	what, machine string
	from, to      time.Time
}

// brakeWindows are the times each brake was in force: from its command's success to its lifting
// command.
func brakeWindows(events []event) []brakeWindow {
	open := map[string]brakeWindow{}
	var out []brakeWindow
	for _, e := range events {
		key := e.Detail + "/" + e.Target
		switch e.Kind {
		case "brake-on":
			what := map[string]string{opPause: "paused", opSuspend: "suspended", opDetach: "detached"}[e.Detail]
			open[key] = brakeWindow{what: what, machine: e.Target, from: e.At}
		case "brake-off":
			if w, ok := open[key]; ok {
				w.to = e.At
				out = append(out, w)
				delete(open, key)
			}
		}
	}
	return out
}

// line is the run's one-line report.
func (r result) line() string {
	verdict := "PASS"
	switch {
	case r.Err != "":
		verdict = "ERROR " + r.Err
	case !r.passed():
		var props []string
		for i, v := range r.Violations {
			if len(v) > 0 {
				props = append(props, fmt.Sprintf("P%d×%d", i+1, len(v)))
			}
		}
		verdict = "FAIL " + strings.Join(props, " ")
	}
	healed := "not healed"
	if r.HealedIn > 0 {
		healed = "healed in " + r.HealedIn.Round(100*time.Millisecond).String()
	}
	if len(r.Held) > 0 {
		healed += fmt.Sprintf(", %d held", len(r.Held))
	}
	if len(r.TradeOffs) > 0 {
		verdict += fmt.Sprintf(" (%d far-side)", len(r.TradeOffs))
	}
	if forged := r.Rejected["bad_signature"] + r.Rejected["unknown_node"] + r.Rejected["unsigned"]; forged > 0 {
		verdict += fmt.Sprintf(" (%d forged reports refused)", forged)
	}
	return fmt.Sprintf("%-18s faults %2d  power actions: hale %d, operator %d  BMC requests %2d  %s  %s",
		r.Schedule.Name, r.Faults, r.count("hale"), r.count("operator")+r.count("operator --force"), r.Requests, healed, verdict)
}

// healthyThrough says whether member i was a healthy voter in every sample from from to to (and in
// at least one).
func healthyThrough(samples []sample, i int, from, to time.Time) bool {
	seen := false
	for _, s := range samples {
		if s.At.Before(from) || s.At.After(to) {
			continue
		}
		if !s.healthy()[i] {
			return false
		}
		seen = true
	}
	return seen
}
