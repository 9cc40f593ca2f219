package health

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hale-dev/hale/config"
)

func init() {
	RegisterProbe(ProbeKind{Name: "clock", Section: func() ProbeSection { return &ClockSection{} },
		Help: "this node's clock against the median of its peers' (from their reports' send times): more than `maxOffset` (500ms) away"})
}

// ClockSection is probes.clock.
type ClockSection struct {
	ProbeSettings
	// MaxOffset is how far this node's clock may be from the median of its peers' (default 500 ms).
	MaxOffset config.Duration `json:"maxOffset"`
}

// New makes the clock probe.
func (s *ClockSection) New(env ProbeEnv) (Probe, error) {
	return NewClockProbe(env.Clock, s.MaxOffset.Duration), nil
}

// Validate checks maxOffset.
func (s *ClockSection) Validate() error {
	if s.MaxOffset.Duration < 0 {
		return errors.New("maxOffset " + s.MaxOffset.String() + ": must not be negative")
	}
	return nil
}

// ClockSource gives clock offsets of peers relative to this node, one sample per peer.
type ClockSource interface {
	ClockOffsets() []time.Duration
}

// clockProbe fails when this node's clock is more than maxOffset away from the median of its peers.
// Offsets come from gossip: when a peer's report arrives, its send time is compared with the local
// receive time (on a LAN the transit time is milliseconds, far below what matters: certificates and
// leases break at seconds).
type clockProbe struct {
	src       ClockSource
	maxOffset time.Duration
}

// NewClockProbe watches the clock offset against peers (default limit 500 ms).
func NewClockProbe(src ClockSource, maxOffset time.Duration) Probe {
	if maxOffset <= 0 {
		maxOffset = 500 * time.Millisecond
	}
	return &clockProbe{src: src, maxOffset: maxOffset}
}

func (p *clockProbe) Name() string { return "clock" }

func (p *clockProbe) Check(context.Context) (bool, string) {
	offsets := p.src.ClockOffsets()
	if len(offsets) == 0 {
		return true, "no peer reports yet to compare with"
	}
	slices.Sort(offsets)
	median := offsets[len(offsets)/2]
	detail := fmt.Sprintf("peers' clocks are %v from ours (median of %d)", median.Round(time.Millisecond), len(offsets))
	if median > p.maxOffset || median < -p.maxOffset {
		return false, detail + fmt.Sprintf("; more than %v: check NTP on this node", p.maxOffset)
	}
	return true, detail
}
