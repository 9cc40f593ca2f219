package pass

import (
	"fmt"
	"time"

	"github.com/hale-dev/hale/bmc"
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

// Taint is what a pass says of a machine's out-of-service taint: wanted (On, with why) or to go.
type Taint struct {
	On  bool
	Why string
}

// OutOfService says, of each machine with a Node it can tell about, whether its Node must carry the
// out-of-service taint now (OutOfService's rule). The taint is wanted while all of these hold: the
// machine is Unhealthy (nobody hears it) with no remediation in flight, it is not detached, its
// latest remediation is a fence that succeeded at least policy.outOfServiceAfter ago, and its BMC's
// latest read, after the fence and at most outOfServiceFresh old, found the power Off. It must go as
// soon as one of them fails for sure: the BMC read On, or could not be read, or read nothing for
// outOfServiceFresh; the machine heard again, detached, or acted on (an operator's reboot powers it
// on); its latest remediation no fence; the policy turned off. A machine about which the pass cannot
// tell yet (Suspect; its BMC not read since the fence, as by a leader just started; fenced less than
// policy.outOfServiceAfter ago) is not in the map: its taint stays as it is.
func OutOfService(f Facts) map[string]Taint {
	after, out := f.Inventory.Policy.OutOfServiceAfter, map[string]Taint{}
	machines := make(map[string]int, len(f.Inventory.Machines)) // a pass at 5000 machines: no search per machine
	for i, m := range f.Inventory.Machines {
		machines[m.Name] = i
	}
	for _, a := range f.Assessments {
		i, ok := machines[a.Machine]
		if !ok || f.Inventory.Machines[i].Node == "" {
			continue
		}
		m := f.Inventory.Machines[i]
		_, detached := f.Detached[m.Name]
		_, inFlight := f.Flights[m.Name]
		hist := f.History[a.Machine]
		switch {
		case after <= 0 || detached || inFlight || a.Verdict == assess.VerdictHealthy:
			out[m.Name] = Taint{}
			continue
		case a.Verdict != assess.VerdictUnhealthy || len(hist) == 0:
			continue // Suspect, or not judged yet: too soon to tell
		}
		fence, read := hist[len(hist)-1], f.BMCs[m.Name]
		switch {
		case !fence.Fenced():
			out[m.Name] = Taint{}
		case !read.Checked.After(fence.Updated) || f.Now.Sub(fence.Updated) < after:
			// not read since the fence, or fenced too recently: nothing to say yet
		case !read.Ready || read.Power != bmc.PowerOff || f.Now.Sub(read.Checked) > outOfServiceFresh:
			out[m.Name] = Taint{}
		default:
			out[m.Name] = Taint{On: true, Why: fmt.Sprintf("fenced by remediation %s at %s and off since: its BMC read the power Off at %s (policy.outOfServiceAfter %v)",
				fence.ID, fence.Updated.UTC().Format(time.RFC3339), read.Checked.UTC().Format(time.RFC3339), after)}
		}
	}
	return out
}
