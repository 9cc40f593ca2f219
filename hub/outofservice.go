package hub

import (
	"context"
	"time"

	"github.com/hale-dev/hale/hub/pass"
)

// watchFenced reads the BMC of each fenced machine every Config.FenceWatch while out-of-service is on,
// so that its taint stands on a fresh read (pass.OutOfService), until ctx ends.
func (h *Hub) watchFenced(ctx context.Context) {
	t := time.NewTicker(h.cfg.FenceWatch)
	defer t.Stop()
	for {
		inv := h.inventory()
		if inv.Policy.OutOfServiceAfter > 0 {
			var fenced []pass.Machine
			for _, m := range inv.Machines {
				if hist := h.ledger.Of(m.Name); m.Endpoint.Driver != "" && len(hist) > 0 && hist[len(hist)-1].Fenced() {
					fenced = append(fenced, m)
				}
			}
			if len(fenced) > 0 {
				h.checkBMCsOf(ctx, inv, fenced, false)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// machineOfNode is the name of the inventory's machine whose Node is node ("" when none).
func (h *Hub) machineOfNode(node string) string {
	m, _ := h.inventory().MachineOfNode(node)
	return m.Name
}
