package pass

import (
	"time"

	"github.com/hale-dev/hale/quorum"
)

// BeginFailure is a remediation the planner admitted and the hub could not begin (its BMC or owner
// could not be reached for, the journal refused it): retried after a wait, without a slot of the rate
// limit, which only a remediation in the journal takes. The wait is short after a first failure (the
// journal's write timed out on the very API server that hung: the machine being healed often serves
// one of the API endpoints, and the next request goes to another) and doubles with each failure in a
// row, up to beginRetry.
type BeginFailure struct {
	why    string
	at     time.Time
	InARow int
}

const beginRetryFirst, BeginRetry = 2 * time.Second, 30 * time.Second

// idleRetry: a machine whose remediation ended idle (ledger.go: nothing done) is begun again no sooner
// (a step the planner admits and the executor's fresh check refuses would otherwise be journaled
// every pass).
const idleRetry = BeginRetry

// Wait is how long after at the remediation is tried again.
func (b BeginFailure) Wait() time.Duration {
	return min(beginRetryFirst<<min(max(b.InARow-1, 0), 5), BeginRetry)
}

// BeginResult is how a begin the pass queued went.
type BeginResult struct {
	Machine string
	Err     error
	At      time.Time
}

// NewMemberSuffix names the replacement's etcd member in a plan: the owner picks the real name.
const NewMemberSuffix = "-replacement"

// MachinePlan is the plan for a machine that is not an etcd member (quorum.PlanMachine).
func MachinePlan(s quorum.Strategy, m Machine) quorum.Plan {
	return quorum.PlanMachine(s, m.Name, m.Name+NewMemberSuffix, m.Replace)
}
