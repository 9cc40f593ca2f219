package pass

import (
	"fmt"
	"strings"
	"time"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/hub/assess"
)

// The verdict is not the action (DESIGN.md rule 14). A machine is called Unhealthy as fast as the
// evidence allows, but the hub power-cycles, fences or replaces it only once it will not come back by
// itself:
//   - dead to a majority of the observers, it has shown no sign of life (a report, an ack, an answer
//     of its etcd member, to any observer) for the stall tolerance, or its BMC proves a hang (its power
//     read Off unasked, a hang in its event log since its last sign of life, its health turned
//     Critical): machines pause (VM stuns and live migrations, storage and CPU stalls, a member
//     catching up) and resume by themselves, and a power cycle of one costs a reboot nothing needed;
//   - alive (its agent reports) with a component failing, it has failed for the component grace: the
//     kubelet (or systemd) restarts a hung or crashed etcd, API server or kubelet first.
// Each is a hold of the hub's own (MayResume, RestartFirst): an operator's reboot is not held.

// stall is what the stall tolerance and the component grace say of one Unhealthy machine now.
type stall struct {
	// hold, when its Why is set, keeps the hub from acting on it now.
	hold Hold
	// grounds say why the hub may act now (for its remediation's reason); proved: on its BMC's proof.
	grounds string
	proved  bool
	// dead: no sign that it runs (dead to a majority of the observers, or its agent silent): not a
	// component failing on a machine that runs.
	dead bool
	// from is when the count began: its last sign of life (dead), or when it began to fail.
	from time.Time
}

// stallOf is what the stall tolerance and the component grace say of m, Unhealthy as a says, when
// etcd has lost quorum (lost) or not.
func stallOf(f Facts, m Machine, a assess.Assessment, lost bool) stall {
	p := f.Inventory.Policy
	needed := lost && m.Member != ""
	class := "etcd keeps quorum without it"
	switch {
	case needed:
		class = "its member is needed for etcd's quorum"
	case m.Member == "":
		class = "it is no etcd member"
	}
	if a.Alive && !a.Dead {
		st := stall{from: a.Since}
		wait, at, class := waitOf(f, p.ComponentGrace, needed, st.from, class)
		if d := f.Now.Sub(st.from); !f.Now.Before(at) {
			st.grounds = fmt.Sprintf("alive but failing for %v, past its component grace of %v (%s)", d.Round(time.Second), wait, class)
			return st
		}
		st.hold = Hold{Reason: ReasonRestartFirst, Why: fmt.Sprintf("%s: failing since %s; its %s begins at %s if it still fails "+
			"(componentGrace %v: %s)", restartWhat(m, a), clock(st.from), m.Strategy, clock(at), wait, class)}
		return st
	}
	st := stall{dead: true, from: deadFrom(f, a)}
	if proof := proofOf(f, m, st.from); proof != "" {
		st.grounds, st.proved = "its BMC proves a hang: "+proof, true
		st.dead = false // the BMC's proof stands, whatever an observer's lagging view says after it
		return st
	}
	// Counted from its last sign of life the hub knows of, and never from before the observers saw it
	// dead: a sign of life reaches the hub seconds late on a loaded network (a report every 5 s), and a
	// machine that paused for less than the tolerance must not be cycled (a loaded stall matrix once
	// cycled one 24.8 s into a hang when the count began at a report 5 s older than the hang).
	count := st.from
	if a.Since.After(count) {
		count = a.Since
	}
	wait, at, class := waitOf(f, p.StallTolerance, needed, count, class)
	// The silence is known only as far as a majority of the observers have reported: a hub or
	// observers starved of CPU, or reports not due yet, hear nothing of anyone, and a machine that
	// resumed in that time is no more silent than they (a loaded run power-cycled one whose stall
	// tolerance ran out while the hub's freshest word from two of the three others was 5 s old).
	// Never later than now, so only asked once the tolerance has run out (each pass holds every
	// machine that waits: no sort of the observers' reports for each of them).
	through := f.Now
	if !f.Now.Before(at) {
		through = heardThrough(f)
	}
	if !through.Before(at) {
		st.grounds = fmt.Sprintf("no sign of life for %v, past its stall tolerance of %v (%s)", through.Sub(st.from).Round(time.Second), wait, class)
		return st
	}
	sooner := ", at once if its BMC proves a hang (power Off unasked, a kernel panic, machine check or watchdog expiry in its event log, health Critical)"
	if m.Endpoint.Driver == "" {
		sooner = "; it has no BMC whose word could prove a hang sooner"
	}
	begins := fmt.Sprintf("begins at %s if it has not answered by then", clock(at))
	if !f.Now.Before(at) {
		begins = fmt.Sprintf("was due at %s, but a majority of the observers have reported only through %s: it begins once their reports pass %s "+
			"and it has not answered", clock(at), clockOr(through, "none of them"), clock(at))
	}
	st.hold = Hold{Reason: ReasonMayResume, Why: fmt.Sprintf("%s has shown no sign of life since %s: a machine that pauses (a VM stun or live migration, "+
		"a storage or CPU stall) resumes by itself. Its %s %s (stallTolerance %v: %s)%s",
		m.Name, clock(st.from), m.Strategy, begins, wait, class, sooner)}
	return st
}

// heardMemo keeps heardThrough for a pass: every machine whose tolerance has run out asks it, and
// it sorts the observers' reports (at 5,000 machines, most of them dead, the pass took 6 ms instead
// of 3.8).
type heardMemo struct {
	done bool
	at   time.Time
}

// heardThrough is the hearing's Through, once a pass.
func heardThrough(f Facts) time.Time {
	if f.heard == nil {
		return f.Hearing.Through(f.Now)
	}
	if !f.heard.done {
		f.heard.done, f.heard.at = true, f.Hearing.Through(f.Now)
	}
	return f.heard.at
}

// waitOf is the wait w gives a machine whose count began at from, when it ends, and class (why that
// wait) with when quorum was lost if it counts from then. The shorter wait of a member needed for
// quorum counts from when the passes began to see quorum lost, if that is later: a loss seen for one
// pass (a loaded moment in which a second member's reports came late) must not cut a 3 min grace to
// nothing for a member that has been failing a minute (a loaded stall matrix power-cycled one whose
// etcd alone hung, 0.6 s into such a loss, 2026-12-02). The longer wait, counted from from, still
// ends when it ends.
func waitOf(f Facts, w PerQuorum, needed bool, from time.Time, class string) (time.Duration, time.Time, string) {
	if !needed || w.Needed >= w.Held {
		return w.For(needed), from.Add(w.For(needed)), class
	}
	held := from.Add(w.Held)
	if !f.lostSince.After(from) {
		return w.Needed, from.Add(w.Needed), class
	}
	if end := f.lostSince.Add(w.Needed); end.Before(held) {
		return w.Needed, end, class + " since " + clock(f.lostSince)
	}
	return w.Held, held, class
}

// deadFrom is when a dead machine's stall began: its last sign of life the hub knows of, else (a hub
// started since) when the observers declared it dead.
func deadFrom(f Facts, a assess.Assessment) time.Time {
	if l := newest(f.lifeAt, a.Machine, a.LifeAt); !l.IsZero() {
		return l
	}
	return a.Since
}

// restartWhat says what a machine that runs waits for: the kubelet's restart of the components that
// fail (systemd's of the kubelet).
func restartWhat(m Machine, a assess.Assessment) string {
	if len(a.Failing) == 0 {
		return fmt.Sprintf("%s's agent reports, and what fails on it may recover by itself (`hub explain %s`)", m.Name, m.Name)
	}
	var parts []string
	for _, c := range a.Failing {
		if c == "kubelet" {
			parts = append(parts, "systemd's restart of the kubelet")
		} else {
			parts = append(parts, "the kubelet's restart of "+c)
		}
	}
	return fmt.Sprintf("%s's agent reports: waiting for %s", m.Name, strings.Join(parts, " and "))
}

func firstReason(a assess.Assessment) string {
	if len(a.Reasons) == 0 {
		return "Unhealthy"
	}
	return a.Reasons[0]
}

// proofOf says how m's BMC proves a hang of the episode that began at from ("" when it does not), as
// the hub last read it (every second while m is watched): its power read Off after from (nobody else
// turns a dead machine off: a machine the hub fenced is held before this is asked), its health read
// Critical after from having read otherwise before, or a hang in its event log dated bmcval.ProofMargin
// before from or later (bmcval.HangSince).
func proofOf(f Facts, m Machine, from time.Time) string {
	ev, ok := f.BMCs[m.Name]
	if !ok || !ev.Ready {
		return ""
	}
	if ev.Checked.After(from) {
		if ev.Power == bmcval.PowerOff {
			return fmt.Sprintf("it read the power Off at %s, which the hub had not asked for", clock(ev.Checked))
		}
		if ev.Health == bmcval.HealthCritical && ev.HealthSince.After(from) {
			return fmt.Sprintf("it read the system's health Critical at %s, having read it otherwise before", clock(ev.HealthSince))
		}
	}
	if h, ok := bmcval.HangSince(ev.Hangs, from); ok {
		return fmt.Sprintf("its event log has %s at %s (entry %s, %q)", h.Kind, clock(h.At), h.ID, h.Message)
	}
	return ""
}

// clock is a time as the holds say it: the time of day, to the tenth of a second, in UTC.
func clock(t time.Time) string { return t.UTC().Format("15:04:05.0Z") }

// clockOr is clock(t), or none when t is zero.
func clockOr(t time.Time, none string) string {
	if t.IsZero() {
		return none
	}
	return clock(t)
}
