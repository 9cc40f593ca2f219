// Package power is what a machine of every test/lab backend shares: its power is its BMC's. The
// namespace lab's machines (test/lab), its real cluster's nodes (test/lab's StartKube) and the
// in-process machines (test/lab/inproc) are each a Machine, run by the project's Redfish simulator
// (Redfish) or by ipmi_sim (FollowIPMI) the same way.
package power

import (
	"time"

	"github.com/hale-dev/hale/test/ipmisim"
)

// Machine is a machine whose power a BMC runs; by says who switched it (a BMC's protocol, a test).
// PowerOff stops every process of the machine at once, with no goodbye; PowerOn boots it with the data
// it had on its disk. Both do nothing when the power is already so.
type Machine interface {
	PowerOn(by string)
	PowerOff(by string)
}

// Redfish is the Redfish simulator's power hook (bmcsim.Config.OnPower): system id's power runs
// machine(id)'s.
func Redfish(machine func(id string) Machine) func(id string, running bool) {
	return func(id string, running bool) {
		if running {
			machine(id).PowerOn("Redfish")
		} else {
			machine(id).PowerOff("Redfish")
		}
	}
}

// FollowIPMI runs m's power from its ipmi_sim's chassis log until stop is called: power 0 stops the
// machine, power 1 starts it, reset 1 (a hard reset) does both, shutdown 1 (the OS shuts down: the
// power goes off a moment later) stops it once the BMC reads its power off.
func FollowIPMI(m Machine, sim *ipmisim.Sim) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		seen, soft := 0, false
		for {
			actions := sim.Actions()
			for _, a := range actions[seen:] {
				switch a {
				case "power 0":
					m.PowerOff("IPMI")
				case "power 1":
					m.PowerOn("IPMI")
				case "reset 1":
					m.PowerOff("IPMI reset")
					m.PowerOn("IPMI reset")
				}
				soft = a == "shutdown 1"
			}
			seen = len(actions)
			if soft && !sim.Power() {
				m.PowerOff("IPMI soft off")
				soft = false
			}
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() { close(quit); <-done }
}
