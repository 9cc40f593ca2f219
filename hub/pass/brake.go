package pass

import (
	"maps"
	"time"
)

// Brake is one hold on the hub or on a machine: who set it, why, and since when.
type Brake struct {
	By     string    `json:"by"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since"`
}

func (b Brake) String() string {
	s := b.By
	if b.Reason != "" {
		s += ": " + b.Reason
	}
	if !b.Since.IsZero() {
		s += " (since " + b.Since.UTC().Format(time.RFC3339) + ")"
	}
	return s
}

// Brakes are the operator's brakes: a pause, observe-only, and machines detached. A BrakeStore keeps
// them across hub restarts and leader failovers.
type Brakes struct {
	Paused    *Brake           `json:"paused,omitempty"`
	Suspended *Brake           `json:"suspended,omitempty"`
	Detached  map[string]Brake `json:"detached,omitempty"`
}

func (b Brakes) Clone() Brakes {
	out := b
	out.Detached = maps.Clone(b.Detached)
	return out
}

// Operator names who asked, for a brake set through the operator API.
const Operator = "operator"
