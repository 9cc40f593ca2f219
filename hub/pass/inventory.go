package pass

import (
	"time"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/quorum"
)

// Inventory is a validated inventory.
type Inventory struct {
	Cluster  string
	Policy   Policy
	Machines []Machine
	// Witnesses are the node names of the witness agents (see InventoryFile).
	Witnesses []string
}

// Policy is the validated policy.
type Policy struct {
	Quorum      quorum.Policy
	Assess      assess.Policy
	RateMax     int
	RatePer     time.Duration
	Cooldown    time.Duration
	MaxAttempts int
	FlapWindow  time.Duration
	// ComeBackTimeout bounds an await-healthy step.
	ComeBackTimeout time.Duration
	// PlannedWork are the kinds of planned work (Kubernetes mode) during which the hub starts nothing
	// on a machine: the inventory's policy.plannedWork (hub.PlannedWorkKinds; nil: none, while a file
	// that sets none has them all).
	PlannedWork []string
	// OutOfServiceAfter (Kubernetes mode): how long a machine Hale fenced must have been off, its BMC
	// reading it Off, before its Node is tainted node.kubernetes.io/out-of-service (OutOfService; 0:
	// never).
	OutOfServiceAfter time.Duration
}

// DefaultPolicy is the policy of an inventory that sets none.
func DefaultPolicy() Policy {
	return Policy{Quorum: quorum.DefaultPolicy(), Assess: assess.DefaultPolicy(), RateMax: 3, RatePer: 10 * time.Minute,
		Cooldown: 5 * time.Minute, MaxAttempts: 3, FlapWindow: time.Hour, ComeBackTimeout: 10 * time.Minute,
		OutOfServiceAfter: time.Minute}
}

// Machine is a validated inventory machine.
type Machine struct {
	assess.MachineRef
	Class    string
	Strategy quorum.Strategy
	Pool     string
	Endpoint bmc.Endpoint
	// Credentials, CAFile, Insecure: how to log in to the BMC.
	Credentials bmc.Credentials
	CAFile      string
	Insecure    bool
	// Replace is what the machine's owner allows when Strategy is Replace (Kubernetes mode).
	Replace quorum.ReplaceOptions
	// Hold, when set, says why the hub must not act on this machine at all (a BareMetalHost detached
	// or paused, no way to heal it): it is watched and explained, never remediated.
	Hold string
	// PlannedWork, when set, says what planned work is under way on the machine (its Node cordoned,
	// its owner rolling out, a NodeMaintenance): the hub starts nothing on it meanwhile; an operator's
	// reboot may. Its evidence counts as ever: a machine that dies under maintenance costs etcd a vote.
	PlannedWork string
	// CheckedBy, when set, names the health checker that judges the machine and hands its
	// remediations to Hale (a MachineHealthCheck whose templateRef is a HaleRemediationTemplate): the
	// hub starts none of its own on it and carries out that checker's requests, as an operator's.
	CheckedBy string
}

// Machine is the inventory's machine of that name.
func (inv Inventory) Machine(name string) (Machine, bool) {
	for _, m := range inv.Machines {
		if m.Name == name {
			return m, true
		}
	}
	return Machine{}, false
}

// MachineOfMember is the inventory's machine whose etcd member is member.
func (inv Inventory) MachineOfMember(member string) (Machine, bool) {
	for _, m := range inv.Machines {
		if m.Member != "" && m.Member == member {
			return m, true
		}
	}
	return Machine{}, false
}

// MachineOfNode is the inventory's machine whose Node is node.
func (inv Inventory) MachineOfNode(node string) (Machine, bool) {
	for _, m := range inv.Machines {
		if m.Node != "" && m.Node == node {
			return m, true
		}
	}
	return Machine{}, false
}

// BMCReadiness is what the last readiness check of a machine's BMC found.
type BMCReadiness struct {
	Checked time.Time `json:"checked"`
	Ready   bool      `json:"ready"`
	// Problem names what is wrong, in one word (bmc.Problem's, or ProblemConfig).
	Problem bmc.Problem    `json:"problem,omitempty"`
	Power   bmc.PowerState `json:"power,omitempty"`
	// Error is the failed call's error, in one line that names the BMC.
	Error string `json:"error,omitempty"`
}

// ProblemConfig: the hub cannot talk to the BMC as configured (ipmitool missing, an unreadable CA
// bundle): nothing was sent.
const ProblemConfig bmc.Problem = "Config"

// Refs are the machines as the assessor knows them, in the inventory's order.
func (inv Inventory) Refs() []assess.MachineRef {
	out := make([]assess.MachineRef, len(inv.Machines))
	for i, m := range inv.Machines {
		out[i] = m.MachineRef
	}
	return out
}
