package pass

import (
	"fmt"
	"time"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// Non-graceful node shutdown (Kubernetes): a Node tainted node.kubernetes.io/out-of-service has its
// pods deleted at once and their volumes detached, so that a StatefulSet's pods and their volumes move
// to another node. Safe only when the node is really off: applied to a running node, two writers share
// a volume. Hale applies it to a machine it fenced, only while its BMC reads it Off.

// FenceWatchEvery is how often the hub reads the BMC of each fenced machine while out-of-service is
// on (policy.outOfServiceAfter; hub.Config.FenceWatch): the taint stands only on a read at most
// outOfServiceFresh old.
const FenceWatchEvery = 30 * time.Second

// outOfServiceFresh: a BMC read older than this is no evidence that the machine is still off (three
// fence watches: one may fail or be late).
const outOfServiceFresh = 90 * time.Second

// Fenced says whether this remediation is a fence that succeeded (powered off, read back Off).
func (p Past) Fenced() bool {
	return p.strategy == quorum.Fence.String() && p.State == journal.Succeeded
}

// Taints is what a pass says of the out-of-service taints: the machines whose Node must carry it now
// (On: why), and those about which it cannot tell yet (Keep: their Node's taint stays as it is);
// every other machine's Node must not carry it. The two are small (fenced machines, Suspect ones),
// so that a pass at thousands of machines says little.
type Taints struct {
	On   map[string]string
	Keep map[string]bool
}

// OutOfService says whether each machine with a Node must carry the out-of-service taint now. The
// taint is wanted while all of these hold: the
// machine is Unhealthy (nobody hears it) with no remediation in flight, it is not detached, its
// latest remediation is a fence that succeeded at least policy.outOfServiceAfter ago, and its BMC's
// latest read, after the fence and at most outOfServiceFresh old, found the power Off. It must go as
// soon as one of them fails for sure: the BMC read On, or could not be read, or read nothing for
// outOfServiceFresh; the machine heard again, detached, or acted on (an operator's reboot powers it
// on); its latest remediation no fence; the policy turned off. A machine about which the pass cannot
// tell yet (Suspect; its BMC not read since the fence, as by a leader just started; fenced less than
// policy.outOfServiceAfter ago) is kept: its taint stays as it is.
func OutOfService(f Facts) Taints {
	after, out := f.Inventory.Policy.OutOfServiceAfter, Taints{On: map[string]string{}, Keep: map[string]bool{}}
	for i := range f.Inventory.Machines {
		m := &f.Inventory.Machines[i]
		a := assessmentAt(f.Assessments, i, m.Name)
		if m.Node == "" {
			continue
		}
		if a == nil {
			out.Keep[m.Name] = true // not judged yet
			continue
		}
		_, detached := f.Detached[m.Name]
		_, inFlight := f.Flights[m.Name]
		switch {
		case after <= 0 || detached || inFlight || a.Verdict == assess.VerdictHealthy:
			continue // off
		case a.Verdict != assess.VerdictUnhealthy || len(f.History[m.Name]) == 0:
			out.Keep[m.Name] = true // Suspect, or never remediated: too soon to tell
			continue
		}
		hist := f.History[m.Name]
		fence, read := hist[len(hist)-1], f.BMCs[m.Name]
		switch {
		case !fence.Fenced():
		case !read.Checked.After(fence.doneAt()) || f.Now.Sub(fence.doneAt()) < after:
			out.Keep[m.Name] = true // not read since the fence, or fenced too recently: nothing to say yet
		case !read.Ready || read.Power != bmcval.PowerOff || f.Now.Sub(read.Checked) > outOfServiceFresh:
		default:
			out.On[m.Name] = fmt.Sprintf("fenced by remediation %s at %s and off since: its BMC read the power Off at %s (policy.outOfServiceAfter %v)",
				fence.ID, fence.doneAt().UTC().Format(time.RFC3339), read.Checked.UTC().Format(time.RFC3339), after)
		}
	}
	return out
}
