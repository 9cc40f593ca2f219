package bmc

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/test/ipmisim"
)

// BenchmarkIPMICycleVsIpmitool power-cycles one ipmi_sim through bmc/ (bmclib's ipmitool provider,
// verified) and through plain `ipmitool -C 3` doing the same (status, cycle, poll until Off then On at
// the same interval), alternating, and reports both and their ratio. Target: ratio ≤ 1.10.
func BenchmarkIPMICycleVsIpmitool(b *testing.B) {
	const poll = 100 * time.Millisecond
	sim := ipmisim.Start(b)
	ep, err := ParseEndpoint(sim.Endpoint())
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(ep, NewCredentials(sim.Username, sim.Password), Options{PollInterval: poll, VerifyTimeout: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	status := func() string {
		out, err := sim.Ipmitool(ctx, "chassis", "power", "status")
		if err != nil {
			b.Fatalf("ipmitool: %v %s", err, out)
		}
		return out
	}
	plain := func() {
		status()
		if out, err := sim.Ipmitool(ctx, "chassis", "power", "cycle"); err != nil {
			b.Fatalf("ipmitool cycle: %v %s", err, out)
		}
		sawOff := false
		for {
			on := strings.Contains(status(), "is on")
			sawOff = sawOff || !on
			if on && sawOff {
				return
			}
			time.Sleep(poll)
		}
	}
	var hale, tool time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := c.PowerCycle(ctx); err != nil {
			b.Fatal(err)
		}
		hale += time.Since(start)
		start = time.Now()
		plain()
		tool += time.Since(start)
	}
	n := float64(b.N)
	b.ReportMetric(hale.Seconds()*1000/n, "hale-ms/cycle")
	b.ReportMetric(tool.Seconds()*1000/n, "ipmitool-ms/cycle")
	b.ReportMetric(hale.Seconds()/tool.Seconds(), "ratio")
}

// BenchmarkRedfishReset is a full verified PowerCycle against bmcsim with zero transition delay over
// HTTPS: connect (service root, session, systems), read, reset, poll, log out. It reports p50/p99.
func BenchmarkRedfishReset(b *testing.B) {
	sim, err := bmcsim.Start(bmcsim.Config{Username: "admin", Password: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	ep, err := ParseEndpoint(sim.Endpoint())
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(ep, NewCredentials("admin", "bench"), Options{Insecure: true, PollInterval: time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := c.PowerCycle(context.Background()); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
