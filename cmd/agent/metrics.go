package main

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hale-dev/hale/health"
)

// agentCollector reads the agent's state at scrape time: no second bookkeeping.
type agentCollector struct {
	agent                                 *health.Agent
	probeOK, probeSince, peers, published *prometheus.Desc
	skew                                  *prometheus.Desc
}

func newAgentCollector(a *health.Agent) *agentCollector {
	return &agentCollector{
		agent:      a,
		probeOK:    prometheus.NewDesc("hale_agent_probe_ok", "1 while the probe passes, 0 while it fails.", []string{"probe"}, nil),
		probeSince: prometheus.NewDesc("hale_agent_probe_state_seconds", "How long the probe has been in its current state.", []string{"probe"}, nil),
		peers:      prometheus.NewDesc("hale_agent_peers", "Peers by liveness as this agent sees them.", []string{"state"}, nil),
		published:  prometheus.NewDesc("hale_agent_reports_published_total", "Reports this agent has published.", nil, nil),
		skew:       prometheus.NewDesc("hale_agent_clock_offset_seconds", "Median of peers' clocks minus this node's.", nil, nil),
	}
}

func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.probeOK, c.probeSince, c.peers, c.published, c.skew} {
		ch <- d
	}
}

func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, r := range c.agent.Runner().Results() {
		ok := 0.0
		if r.OK {
			ok = 1
		}
		ch <- prometheus.MustNewConstMetric(c.probeOK, prometheus.GaugeValue, ok, r.Name)
		ch <- prometheus.MustNewConstMetric(c.probeSince, prometheus.GaugeValue, now.Sub(r.Since).Seconds(), r.Name)
	}
	counts := map[health.PeerState]float64{health.PeerAlive: 0, health.PeerDead: 0, health.PeerLeft: 0}
	for _, p := range c.agent.Gossip().Peers() {
		counts[p.State]++
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.peers, prometheus.GaugeValue, n, string(st))
	}
	n, _ := c.agent.Status()
	ch <- prometheus.MustNewConstMetric(c.published, prometheus.CounterValue, float64(n))
	if offs := c.agent.Gossip().ClockOffsets(); len(offs) > 0 {
		slices.Sort(offs)
		ch <- prometheus.MustNewConstMetric(c.skew, prometheus.GaugeValue, offs[len(offs)/2].Seconds())
	}
}
