// Package quorumtest builds the fleets the planner's benchmarks run on, so that a benchmark elsewhere
// (the hub's pass against the planner's, measured in turns) plans the very same fleet.
package quorumtest

import (
	"fmt"
	"time"

	"github.com/hale-dev/hale/quorum"
)

// Fleet is n machines: 7 etcd voters (one dead, one sick node with a healthy member) and n−7 machines
// that are not etcd members, in 10 pools, 3 % unhealthy and 1 % in flight.
func Fleet(n int) quorum.Input {
	t0 := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	var c quorum.Cluster
	ms := make([]quorum.Machine, 0, n)
	for i := range 7 {
		m := quorum.Member{Name: fmt.Sprintf("etcd-%d", i+1), Health: quorum.Healthy}
		if i == 6 {
			m.Health = quorum.Unhealthy
		}
		c.Members = append(c.Members, m)
		ms = append(ms, quorum.Machine{Name: fmt.Sprintf("cp-%d", i), Member: m.Name, Unhealthy: i >= 5, Since: t0, Strategy: quorum.Reboot})
	}
	for i := 7; i < n; i++ {
		ms = append(ms, quorum.Machine{Name: fmt.Sprintf("w-%05d", i), Pool: fmt.Sprintf("pool-%d", i%10),
			Unhealthy: i%33 == 0, InFlight: i%100 == 0, Since: t0.Add(time.Duration(i%17) * time.Second), Strategy: quorum.Reboot})
	}
	return quorum.Input{Cluster: c, Machines: ms, Policy: quorum.DefaultPolicy()}
}
