package hub

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/hale-dev/hale/hub/assess/assesstest"
)

// /healthz's word on the pipeline: a leader whose passes stopped must not look alive.
func TestStalled(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	for _, tc := range []struct {
		name              string
		started, lastPass time.Time
		want              string
	}{
		{"not started", time.Time{}, time.Time{}, "the pipeline has not started"},
		{"warming up", now.Add(-time.Minute), time.Time{}, ""},
		{"no first pass after the grace", now.Add(-3 * time.Minute), time.Time{}, "no pass since the pipeline started 3m0s ago"},
		{"passing", now.Add(-time.Hour), now.Add(-200 * time.Millisecond), ""},
		{"stalled", now.Add(-time.Hour), now.Add(-45 * time.Second), "the pipeline stalled: no pass for 45s (one is due every 200ms)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &Hub{cfg: Config{Tick: 200 * time.Millisecond}, started: tc.started, lastPass: tc.lastPass}
			got := h.Stalled(now, 2*time.Minute, 30*time.Second)
			if tc.want == "" {
				assert.Empty(t, got)
			} else {
				assert.Contains(t, got, tc.want)
			}
		})
	}
}
