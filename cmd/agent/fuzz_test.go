package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hale-dev/hale/health"
)

const fuzzAgentConfig = `cluster: hale
node: cp-1
gossip:
  bind: 0.0.0.0:7946
  join: ["hale-agent.hale-system.svc.cluster.local:7946"]
  keyFile: /etc/hale/gossip/key
  probeInterval: 500ms
listen: 127.0.0.1:9101
etcd:
  endpoint: https://127.0.0.1:2379
probes:
  etcdDisk: {dataDir: /var/lib/etcd, minFreePercent: 10}
  clock: {interval: 5s, maxOffset: 500ms}
`

// FuzzAgentConfig loads fuzzer-made agent configuration files the way the agent does (read, defaults,
// validate). It fails on a panic; on an error that names neither the file nor a field; and on a
// configuration accepted that the agent could not run as written: a duration that is not positive
// (a ticker panics on one), a probe timeout longer than its interval, a percentage out of range, a
// bind address that is not host:port. Defaults must be a fixed point: applied twice, nothing changes.
func FuzzAgentConfig(f *testing.F) {
	f.Add([]byte(fuzzAgentConfig))
	f.Add([]byte("cluster: c\ngossip: {keyFile: k}\nreportInterval: -5s\n"))
	f.Add([]byte("cluster: c\ngossip: {keyFile: k}\nprobes: {kubelet: {interval: 100ms, timeout: 2s}}\n"))
	f.Add([]byte("cluster: c\nrole: witness\ngossip: {keyFile: k}\netcd: {endpoints: [\"https://10.0.0.1:2379\"]}\n"))
	f.Add([]byte("cluster: c\ngossip: {keyFile: k}\nprobes: {etcdDisk: {minFreePercent: 140}}\n"))
	path := filepath.Join(f.TempDir(), "agent.yaml")
	fields := []string{"role", "etcd.", "probes", "cluster", "gossip.", "node", "listen", "reportInterval"}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := loadConfig(path)
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("the error does not name the file: %v", err)
			}
			return
		}
		c = c.withDefaults()
		if err := c.validate(); err != nil {
			for _, field := range fields {
				if strings.HasPrefix(err.Error(), field) {
					return
				}
			}
			t.Fatalf("the error does not start with the field: %v", err)
		}
		if again := c.withDefaults(); !reflect.DeepEqual(again, c) {
			t.Fatalf("defaults applied twice differ:\n%+v\n%+v", c, again)
		}
		for name, d := range map[string]time.Duration{"reportInterval": c.ReportInterval.Duration, "gossip.probeInterval": c.Gossip.ProbeInterval.Duration,
			"gossip.probeTimeout": c.Gossip.ProbeTimeout.Duration, "gossip.gossipInterval": c.Gossip.GossipInterval.Duration} {
			if d <= 0 {
				t.Fatalf("%s %v accepted", name, d)
			}
		}
		for _, name := range health.ProbeNames() {
			s := c.Probes.section(name)
			if s == nil {
				t.Fatalf("probes.%s: no section after defaults", name)
			}
			pc := s.Common()
			if pc.Enabled == nil || pc.Interval.Duration <= 0 || pc.Timeout.Duration <= 0 || pc.Timeout.Duration > pc.Interval.Duration {
				t.Fatalf("probes.%s: enabled %v, interval %v, timeout %v accepted", name, pc.Enabled, pc.Interval, pc.Timeout)
			}
			if v, ok := s.(health.ValidatedSection); ok && v.Validate() != nil {
				t.Fatalf("probes.%s accepted: %v", name, v.Validate())
			}
		}
		if _, _, err := splitHostPort(c.Gossip.Bind); err != nil {
			t.Fatalf("gossip.bind %q accepted: %v", c.Gossip.Bind, err)
		}
	})
}
