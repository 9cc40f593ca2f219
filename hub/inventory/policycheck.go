package inventory

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/quorum"
)

// The checks a policy's fields get wherever an operator writes them (the inventory's policy: section,
// a HealthPolicy's spec), so that one value is refused, or taken, alike in both. field is the path the
// operator wrote, as the error names it (policy.cooldown, spec.cooldown).

// CheckLimit reads a pool limit (quorum.ParseLimit); ok false: not set ("").
func CheckLimit(field, value string) (l quorum.Limit, ok bool, err error) {
	if value == "" {
		return l, false, nil
	}
	if l, err = quorum.ParseLimit(value); err != nil {
		return l, false, fmt.Errorf("%s: %w", field, err)
	}
	return l, true, nil
}

// CheckProbeTimeouts holds each named probe to one the agents have, its timeout positive (in the
// probes' order, so the first wrong one is named the same each time).
func CheckProbeTimeouts(field string, timeouts map[string]time.Duration) error {
	for _, probe := range slices.Sorted(maps.Keys(timeouts)) {
		if _, err := health.LookupProbe(probe); err != nil {
			return fmt.Errorf("%s.%s: %w", field, probe, err)
		}
		if d := timeouts[probe]; d <= 0 {
			return fmt.Errorf("%s.%s: %v must be positive", field, probe, d)
		}
	}
	return nil
}

// CheckWait holds a duration to zero or more; zero says what zero means ("": nothing to say).
func CheckWait(field string, d time.Duration, zero string) error {
	if d >= 0 {
		return nil
	}
	if zero != "" {
		return fmt.Errorf("%s: %v must not be negative (0s: %s)", field, d, zero)
	}
	return fmt.Errorf("%s: %v must not be negative", field, d)
}
