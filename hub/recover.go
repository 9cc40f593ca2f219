package hub

import (
	"context"
	"fmt"

	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/hub/recoveryplan"
)

// RecoveryPlan says how etcd would be recovered now from its most advanced survivor; while a recovery
// is under way, the plan it follows.
func (h *Hub) RecoveryPlan(ctx context.Context) pass.RecoveryPlan {
	rec, err := h.underway(ctx)
	if rec != nil {
		return rec.Plan
	}
	p := recoveryplan.Of(h.Status(ctx), h.inventory(), h.gossipNow(), operator.RecoverRequest{})
	if err != nil {
		// Not a fresh plan: a recovery may be under way that the journal could not say (Recover
		// refuses the same way).
		p.Blockers = append(p.Blockers, fmt.Sprintf("the journal could not say whether an etcd recovery is already under way (%v): "+
			"a second recovery would rebuild etcd again from another survivor; make the journal readable first", err))
	}
	return p
}
