package hub

import (
	"fmt"
	"reflect"

	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/pass"
)

// SetPolicyOverride puts an override of the inventory's policy in force from the next pass on.
func (h *Hub) SetPolicyOverride(o inventory.PolicyOverride) {
	h.mu.Lock()
	before := h.effective()
	h.override = o
	after := h.effective()
	h.mu.Unlock()
	if !reflect.DeepEqual(before, after) {
		h.say(pass.Notice{Reason: pass.ReasonPolicyChanged, Message: fmt.Sprintf("policy in force: %s", after)})
	}
}

// effective is the policy in force (h.mu held).
func (h *Hub) effective() inventory.EffectivePolicy {
	return inventory.EffectiveOf(h.override.Apply(h.inv.Policy), h.override.Fields())
}
