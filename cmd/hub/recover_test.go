package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/quorum"
)

// What `hub recover --yes` says while it waits: the BMC operation the hub's pause waits for, by
// remediation, machine and step; then the fence.
func TestRecoveryProgress(t *testing.T) {
	busy := operator.Status{Pause: operator.Pausing, Machines: []operator.MachineStatus{
		{Name: "cp-0"},
		{Name: "cp-1", Remediation: &operator.InFlight{ID: "cp-1/1", Busy: true, Step: 0,
			Steps: []quorum.Step{{Op: quorum.OpPowerCycle, Member: "etcd-1"}, {Op: quorum.OpAwaitHealthy, Member: "etcd-1"}}}},
		{Name: "cp-2", Remediation: &operator.InFlight{ID: "cp-2/1", Busy: false, Step: 1,
			Steps: []quorum.Step{{Op: quorum.OpPowerCycle, Member: "etcd-2"}, {Op: quorum.OpAwaitHealthy, Member: "etcd-2"}}}},
	}}
	assert.Equal(t, "the hub is pausing: waiting for a BMC operation under way to end, which cannot be called back "+
		"(remediation cp-1/1 of cp-1, inside power-cycle etcd-1)", recoveryProgress(busy))
	assert.Equal(t, "the hub is paused; fencing the lost members through their BMCs (each powered off and read back Off)",
		recoveryProgress(operator.Status{Pause: operator.Paused}))
}
