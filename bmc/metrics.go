package bmc

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts and times BMC calls. A nil *Metrics records nothing.
type Metrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMetrics registers Hale's BMC metrics with reg:
//
//	hale_bmc_calls_total{driver, call, result}        calls by result: ok, auth, refused, unverified
//	hale_bmc_call_duration_seconds{driver, call}      end-to-end, verification included
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hale_bmc_calls_total",
			Help: "BMC calls (status, on, off, cycle, reboot) by driver and result.",
		}, []string{"driver", "call", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hale_bmc_call_duration_seconds",
			Help:    "Time a BMC call took, verification included.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"driver", "call"}),
	}
	for _, c := range []prometheus.Collector{m.calls, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) observe(driver, call string, err error, took time.Duration) {
	if m == nil {
		return
	}
	m.calls.WithLabelValues(driver, call, resultLabel(err)).Inc()
	m.duration.WithLabelValues(driver, call).Observe(took.Seconds())
}

func resultLabel(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrAuth):
		return "auth"
	case errors.Is(err, ErrUnverified):
		return "unverified"
	}
	return "refused"
}
