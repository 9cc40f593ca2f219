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
// on (policy.outOfServiceAfter): the taint stands only on a read at most outOfServiceFresh old.
const FenceWatchEvery = 30 * time.Second

// outOfServiceFresh: a BMC read older than this is no evidence that the machine is still off (three
// fence watches: one may fail or be late).
const outOfServiceFresh = 3 * FenceWatchEvery

// Fenced says whether this remediation is a fence that succeeded (powered off, read back Off).
func (p Past) Fenced() bool {
	return p.strategy == quorum.Fence.String() && p.State == journal.Succeeded
}

// OutOfService are the machines whose Node must carry the out-of-service taint now, by machine, with
// why (none when the policy turns it off: the taints Hale put on go). A machine qualifies while all of these hold: it has a Node, it
// is Unhealthy (nobody hears it) with no remediation in flight, it is not detached, its latest
// remediation is a fence that succeeded at least policy.outOfServiceAfter ago, and its BMC's latest
// read, after the fence and at most outOfServiceFresh old, found the power Off. Anything else (the
// BMC reads On or cannot be read, an operator powered it on, it is heard again) and the taint goes.
func OutOfService(f Facts) map[string]string {
	after, out := f.Inventory.Policy.OutOfServiceAfter, map[string]string{}
	if after <= 0 {
		return out
	}
	for _, a := range f.Assessments {
		m, ok := f.Inventory.Machine(a.Machine)
		hist := f.History[a.Machine]
		if !ok || m.Node == "" || a.Verdict != assess.VerdictUnhealthy || len(hist) == 0 {
			continue
		}
		if _, detached := f.Detached[m.Name]; detached {
			continue
		}
		if _, inFlight := f.Flights[m.Name]; inFlight {
			continue
		}
		fence, read := hist[len(hist)-1], f.BMCs[m.Name]
		if !fence.Fenced() || f.Now.Sub(fence.Updated) < after {
			continue
		}
		if !read.Ready || read.Power != bmc.PowerOff || !read.Checked.After(fence.Updated) || f.Now.Sub(read.Checked) > outOfServiceFresh {
			continue
		}
		out[m.Name] = fmt.Sprintf("fenced by remediation %s at %s and off since: its BMC read the power Off at %s (policy.outOfServiceAfter %v)",
			fence.ID, fence.Updated.UTC().Format(time.RFC3339), read.Checked.UTC().Format(time.RFC3339), after)
	}
	return out
}
