package hub

import (
	"time"

	"github.com/hale-dev/hale/quorum"
)

// beginFailure is a remediation the planner admitted and the hub could not begin (its BMC or owner
// could not be reached for, the journal refused it): retried after a wait, without a slot of the rate
// limit, which only a remediation in the journal takes. The wait is short after a first failure (the
// journal's write timed out on the very API server that hung: the machine being healed often serves
// one of the API endpoints, and the next request goes to another) and doubles with each failure in a
// row, up to beginRetry.
type beginFailure struct {
	why    string
	at     time.Time
	inARow int
}

const beginRetryFirst, beginRetry = 2 * time.Second, 30 * time.Second

// idleRetry: a machine whose remediation ended idle (ledger.go: nothing done) is begun again no sooner
// (a step the planner admits and the executor's fresh check refuses would otherwise be journaled
// every pass).
const idleRetry = beginRetry

// wait is how long after at the remediation is tried again.
func (b beginFailure) wait() time.Duration {
	return min(beginRetryFirst<<min(max(b.inARow-1, 0), 5), beginRetry)
}

// beginResult is how a begin the pass queued went.
type beginResult struct {
	machine string
	err     error
	at      time.Time
}

// newMemberSuffix names the replacement's etcd member in a plan: the owner picks the real name.
const newMemberSuffix = "-replacement"

// machinePlan is the plan for a machine that is not an etcd member (quorum.PlanMachine).
func machinePlan(s quorum.Strategy, m Machine) quorum.Plan {
	return quorum.PlanMachine(s, m.Name, m.Name+newMemberSuffix, m.Replace)
}
