package inventory

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// FuzzInventory loads fuzzer-made inventory files. It fails on a panic; on a result that differs
// between two loads of the same file (an error chosen by map order); on an error that does not name
// the file; and on an accepted inventory that breaks what the hub relies on: unique machine names,
// nodes and members, witnesses apart from machines, endpoints that read back the same, credentials,
// and a policy with positive limits and no negative duration.
func FuzzInventory(f *testing.F) {
	path := exampleInventory(f)
	example, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	for _, file := range []string{"fleet.yaml", "quorum-lost.yaml", "replace-in-flight.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "examples", file))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("cluster: c\nclasses: {a: {strategy: reboot}, b: {strategy: nope}, c: {strategy: nope}}\nmachines: []\n"))
	f.Add([]byte("cluster: c\npolicy: {probeTimeouts: {a: -1s, b: 0s}, cooldown: -1m}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		inv, err := Load(path)
		again, err2 := Load(path)
		switch {
		case (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() || !reflect.DeepEqual(inv, again):
			t.Fatalf("two loads of one file differ: %v / %v", err, err2)
		case err != nil && !strings.Contains(err.Error(), path):
			t.Fatalf("the error does not name the file: %v", err)
		case err != nil:
			return
		}
		checkInventory(t, inv)
	})
}

func checkInventory(t *testing.T, inv pass.Inventory) {
	t.Helper()
	if inv.Cluster == "" {
		t.Fatal("accepted without a cluster")
	}
	names, nodes, members := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, m := range inv.Machines {
		switch {
		case m.Name == "" || strings.Contains(m.Name, "/") || names[m.Name]:
			t.Fatalf("machine name %q: empty, with /, or twice", m.Name)
		case m.Node == "" || nodes[m.Node]:
			t.Fatalf("machine %s: node %q empty or another machine's", m.Name, m.Node)
		case m.Member != "" && members[m.Member]:
			t.Fatalf("machine %s: member %q is another machine's", m.Name, m.Member)
		case m.Pool == "":
			t.Fatalf("machine %s: no pool", m.Name)
		case m.Credentials.Username == "" || m.Credentials.Password() == "":
			t.Fatalf("machine %s: credentials without username or password", m.Name)
		}
		if s, err := quorum.ParseStrategy(m.Strategy.String()); err != nil || s != m.Strategy {
			t.Fatalf("machine %s: strategy %v does not read back: %v", m.Name, m.Strategy, err)
		}
		if ep, err := bmc.ParseEndpoint(m.Endpoint.String()); err != nil || ep != m.Endpoint {
			t.Fatalf("machine %s: endpoint %+v reads back as %+v (%v)", m.Name, m.Endpoint, ep, err)
		}
		names[m.Name], nodes[m.Node], members[m.Member] = true, true, m.Member != ""
	}
	for _, w := range inv.Witnesses {
		if w == "" || strings.ContainsAny(w, " /") || nodes[w] {
			t.Fatalf("witness %q: empty, with space or /, a machine's node or twice", w)
		}
		nodes[w] = true
	}
	p := inv.Policy
	if err := p.Quorum.Validate(); err != nil {
		t.Fatalf("accepted a quorum policy that does not validate: %v", err)
	}
	if p.RateMax <= 0 || p.MaxAttempts <= 0 {
		t.Fatalf("rate limit max %d, max attempts %d: must be positive", p.RateMax, p.MaxAttempts)
	}
	for name, d := range map[string]int64{"rateLimit.per": int64(p.RatePer), "cooldown": int64(p.Cooldown), "flapWindow": int64(p.FlapWindow),
		"deadTimeout": int64(p.Assess.DeadTimeout), "etcdUnreachableTimeout": int64(p.Assess.EtcdUnreachableTimeout), "staleAfter": int64(p.Assess.StaleAfter)} {
		if d < 0 {
			t.Fatalf("policy.%s: accepted negative", name)
		}
	}
	for probe, d := range p.Assess.ProbeTimeouts {
		if _, err := health.LookupProbe(probe); err != nil {
			t.Fatalf("policy.probeTimeouts.%s accepted: %v", probe, err)
		}
		if d <= 0 {
			t.Fatalf("policy.probeTimeouts.%s: %v accepted", probe, d)
		}
	}
	for cond, d := range p.Assess.NodeConditionTimeouts {
		if d <= 0 {
			t.Fatalf("policy.nodeConditionTimeouts.%s: %v accepted", cond, d)
		}
	}
}
