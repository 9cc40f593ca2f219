package bmcval

// PowerState is a machine's power state as its BMC reports it.
type PowerState string

// Power states (Redfish's names; IPMI maps onto On and Off).
const (
	PowerOn         PowerState = "On"
	PowerOff        PowerState = "Off"
	PowerPoweringOn PowerState = "PoweringOn"
	// PowerPoweringOff is a transient state on the way to Off.
	PowerPoweringOff PowerState = "PoweringOff"
	PowerUnknown     PowerState = "Unknown"
)

// Problem is what a failed call says is wrong with a BMC, for a readiness check: the operator's
// first question ("can Hale reach and log in to this BMC?") in one word.
type Problem string

// Problems, from the outside in.
const (
	ProblemNone        Problem = ""
	ProblemUnreachable Problem = "Unreachable"  // no answer: the address, the port, the network path, the BMC itself
	ProblemLogin       Problem = "LoginRefused" // the credentials (or the account, locked or without the privilege)
	ProblemNoSystem    Problem = "NoSuchSystem" // the endpoint's /systems/ID
	ProblemAnswer      Problem = "BadAnswer"    // it answered, but refused or failed the request
)
