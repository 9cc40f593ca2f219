package assess

import (
	"fmt"
	"time"

	"github.com/hale-dev/hale/health/report"
)

// probes weighs m's own probe results against the policy's timeouts. A failure is known to have
// lasted until the report that carries it was sent, not until now: an agent that dies (or is cut off)
// while its probe fails must not let the failure grow for as long as its last report stays fresh
// (found by test/chaos seed 3: a member with no leader during a partition, its agent killed just after
// the heal, was power-cycled on that last report though healthy again).
func (a *Assessor) probes(m MachineRef, own *report.Report, now time.Time, ev *evidence) {
	upTo := minTime(now, own.SentAt)
	for _, p := range own.Probes {
		if p.OK {
			continue
		}
		timeout, counts := a.policy.ProbeTimeouts[p.Name]
		if !counts {
			continue
		}
		ev.failing = append(ev.failing, p.Name)
		if p.Name == "etcd" {
			if why, whyNot := a.catchingUp(own); why != "" {
				timeout += a.policy.EtcdCatchUp
				p.Detail += fmt.Sprintf("; catching up (%s): %v more allowed", why, a.policy.EtcdCatchUp)
			} else {
				p.Detail += "; " + whyNot
			}
		}
		if d, start, from := a.countedFor(m.Member, upTo, p.Since); d >= timeout {
			ev.bad(start, "%s failing for %v%s (unhealthy at %v): %s", p.Name, upTo.Sub(p.Since).Round(time.Second), from, timeout, p.Detail)
		} else {
			ev.doubt("%s failing for %v%s (unhealthy at %v): %s", p.Name, upTo.Sub(p.Since).Round(time.Millisecond), from, timeout, p.Detail)
		}
	}
}

// nodeConditions weighs m's Node conditions: past their timeout they count as unhealthy only when
// other evidence already stands against m (never alone: the API server's view of a node is one more
// observer, not a verdict), otherwise they are doubts.
func (a *Assessor) nodeConditions(m MachineRef, now time.Time, ev *evidence) {
	corroborated := len(ev.unhealthy)+len(ev.suspect) > 0
	for _, c := range m.Conditions {
		timeout, counts := a.policy.NodeConditionTimeouts[c.Type]
		if !counts || !c.bad() {
			continue
		}
		d, start, from := a.countedFor(m.Member, now, c.Since)
		what := fmt.Sprintf("node %s %s=%s (%s) for %v%s", m.Node, c.Type, c.Status, c.Reason, now.Sub(c.Since).Round(time.Second), from)
		switch {
		case d >= timeout && corroborated:
			ev.bad(start, "%s, with the evidence above", what)
		case d >= timeout:
			ev.doubt("%s, but nothing else stands against it: not enough alone", what)
		default:
			ev.doubt("%s (counts at %v)", what, timeout)
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
