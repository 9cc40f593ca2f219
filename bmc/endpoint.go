// Package bmc controls machine power through baseboard management controllers, Redfish (gofish) or
// IPMI (bmclib's ipmitool provider), and verifies every change by polling the BMC until the expected
// state is observed.
package bmc

import "github.com/hale-dev/hale/bmc/bmcval"

// Endpoint is where a BMC is and how to speak to it (bmcval.Endpoint). It never holds credentials.
type Endpoint = bmcval.Endpoint

// Driver names.
const (
	DriverRedfish = bmcval.DriverRedfish
	DriverIPMI    = bmcval.DriverIPMI
)

// ParseEndpoint reads a BMC's address (bmcval.ParseEndpoint).
func ParseEndpoint(s string) (Endpoint, error) { return bmcval.ParseEndpoint(s) }
