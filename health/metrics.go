package health

import "github.com/prometheus/client_golang/prometheus"

// gossipCollector reads a gossip member's reject and key-order counts at scrape time: the agent's and
// the hub's (the hub decides on what it accepts, so forged or replayed reports show there first).
type gossipCollector struct {
	g                  *Gossip
	rejected, keyOrder *prometheus.Desc
}

// NewGossipCollector returns the collector of g's counts, named prefix_gossip_… (hale_agent, hale_hub).
func NewGossipCollector(g *Gossip, prefix string) prometheus.Collector {
	return &gossipCollector{g: g,
		rejected: prometheus.NewDesc(prefix+"_gossip_rejected_total",
			"Gossip messages rejected: undecodable, undecryptable (a key this member does not hold), other_cluster, future (version or send time too far ahead), "+
				"not_sender (a report under a member's name from another address), unsigned, unknown_node (no key pinned for its name), bad_signature "+
				"(not signed by a key pinned for its name); alive_* the same for a claim to a name at an address.",
			[]string{"reason"}, nil),
		keyOrder: prometheus.NewDesc(prefix+"_gossip_key_order_errors_total",
			"Key file changes that made first a key this member did not hold (a key rotation out of order).", nil, nil),
	}
}

func (c *gossipCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rejected
	ch <- c.keyOrder
}

func (c *gossipCollector) Collect(ch chan<- prometheus.Metric) {
	for reason, n := range c.g.Rejected() {
		ch <- prometheus.MustNewConstMetric(c.rejected, prometheus.CounterValue, float64(n), reason)
	}
	ch <- prometheus.MustNewConstMetric(c.keyOrder, prometheus.CounterValue, float64(c.g.KeyOrderErrors()))
}
