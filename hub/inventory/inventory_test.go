package inventory

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// exampleInventory is examples/inventory.yaml in a temporary directory beside the credentials file
// made there by the command its comment gives (only its owner may read it). The example names its
// credentials relative to itself.
func exampleInventory(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	inv, err := os.ReadFile("../../examples/inventory.yaml")
	require.NoError(t, err)
	var make string
	for _, line := range strings.Split(string(inv), "\n") {
		if c, ok := strings.CutPrefix(line, "#   install -m 600"); ok {
			make = "install -m 600" + c
		}
	}
	require.NotEmpty(t, make, "the example says how to make its credentials file")
	cmd := exec.Command("sh", "-c", make)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s: %s", make, out)
	path := filepath.Join(dir, "inventory.yaml")
	require.NoError(t, os.WriteFile(path, inv, 0o600))
	return path
}

// Relative credentials and caFile paths are the inventory's directory's, not the working directory's:
// the hub started from anywhere (systemd starts it in /) reads the same files.
func TestInventoryPathsAreRelativeToTheFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "secrets"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "secrets", "bmc"), []byte("username=admin\npassword=pw\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.pem"), []byte("not read here"), 0o600))
	abs := filepath.Join(dir, "secrets", "bmc")
	body := "cluster: c\nclasses: {cp: {strategy: reboot}}\nmachines:\n" +
		"  - {name: m1, member: e1, class: cp, bmc: {endpoint: \"redfish://10.0.0.1\", credentials: secrets/bmc, caFile: ca.pem}}\n" +
		"  - {name: m2, member: e2, class: cp, bmc: {endpoint: \"redfish://10.0.0.2\", credentials: " + abs + "}}\n" +
		"  - {name: m3, member: e3, class: cp, bmc: {endpoint: \"redfish://10.0.0.3\", credentials: ./secrets/../secrets/bmc}}\n"
	path := filepath.Join(dir, "inventory.yaml")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	t.Chdir(t.TempDir()) // somewhere else: nothing there
	inv, err := Load(path)
	require.NoError(t, err)
	for _, m := range inv.Machines {
		assert.Equal(t, "admin", m.Credentials.Username, m.Name)
	}
	assert.Equal(t, filepath.Join(dir, "ca.pem"), inv.Machines[0].CAFile)

	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(body, "secrets/bmc,", "missing/bmc,", 1)), 0o600))
	_, err = Load(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "machines[0] (m1).bmc.credentials")
	assert.Contains(t, err.Error(), filepath.Join(dir, "missing", "bmc"), "the error names the path it tried")
}

func TestLoadExampleInventory(t *testing.T) {
	inv, err := Load(exampleInventory(t))
	require.NoError(t, err)
	assert.Equal(t, "prod-eu1", inv.Cluster)
	require.Len(t, inv.Machines, 4)
	cp2 := inv.Machines[1]
	assert.Equal(t, "cp-2", cp2.Node, "node defaults to the name")
	assert.Equal(t, "etcd-2", cp2.Member)
	assert.Equal(t, "1", cp2.Endpoint.SystemID)
	assert.Equal(t, quorum.Reboot, cp2.Strategy)
	assert.Equal(t, "hale", cp2.Credentials.Username)
	assert.Equal(t, "the password", cp2.Credentials.Password())
	assert.Equal(t, "workers", inv.Machines[3].Pool)
	assert.Equal(t, "control-plane", cp2.Pool)
	assert.Equal(t, 10*time.Second, inv.Policy.Assess.ProbeTimeouts["etcd"])
	assert.Equal(t, quorum.Percent(40), inv.Policy.Quorum.Pools.MaxUnhealthy)
	assert.Equal(t, 3, inv.Policy.RateMax)
	assert.Equal(t, pass.PerQuorum{Held: 30 * time.Second, Needed: 10 * time.Second}, inv.Policy.StallTolerance)
	assert.Equal(t, pass.PerQuorum{Held: 3 * time.Minute, Needed: 30 * time.Second}, inv.Policy.ComponentGrace)
	assert.Equal(t, 5*time.Minute, inv.Policy.Cooldown)
	assert.Equal(t, []string{"witness-a", "witness-b"}, inv.Witnesses)
}

func TestInventoryErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	require.NoError(t, os.WriteFile(creds, []byte("username=a\npassword=b\n"), 0o600))
	head := "cluster: c\nclasses: {cp: {strategy: reboot}}\n"
	machine := func(extra string) string {
		return "machines:\n  - {name: m1, member: e1, class: cp, bmc: {endpoint: \"redfish://10.0.0.1\", credentials: " + creds + "}" + extra + "}\n"
	}
	tests := []struct{ name, body, want string }{
		{"unknown field", head + machine(", rack: 7"), `inv.yaml:4: machines[0] (m1).rack: unknown field`},
		{"a typo", "cluster: c\npolicy:\n  maxUnhealty: 1\nclasses: {cp: {strategy: reboot}}\n" + machine(""),
			"inventory " + "%s:3: policy.maxUnhealty: unknown field; did you mean maxUnhealthy?"},
		{"a bad duration", "cluster: c\npolicy: {cooldown: 5mins}\nclasses: {cp: {strategy: reboot}}\n" + machine(""),
			`inv.yaml:2: policy.cooldown: want a duration like "500ms" or "2s", got "5mins"`},
		{"a word for a number", "cluster: c\npolicy: {maxAttempts: three}\nclasses: {cp: {strategy: reboot}}\n" + machine(""),
			`inv.yaml:2: policy.maxAttempts: want a whole number, got "three"`},
		{"a mapping for a list", head + "machines: {name: m1}\n", "inv.yaml:3: machines: want a list, got a mapping"},
		{"not YAML", "cluster: [\n", "inv.yaml: not YAML: "},
		{"no cluster", "classes: {}\n", "cluster: required"},
		{"witness on a machine's node", "cluster: c\nclasses: {cp: {strategy: reboot}}\nwitnesses: [m1]\n" + machine(""), `witnesses[0]: "m1" is a machine's node`},
		{"empty witness", "cluster: c\nclasses: {cp: {strategy: reboot}}\nwitnesses: [\"\"]\n" + machine(""), `witnesses[0]: "" must be a gossip node name`},
		{"bad strategy", "cluster: c\nclasses: {cp: {strategy: nuke}}\n" + machine(""), `classes.cp.strategy: strategy "nuke": want reboot, fence or replace`},
		{"replace for BMC machines", "cluster: c\nclasses: {cp: {strategy: replace}}\n" + machine(""),
			`classes.cp.strategy: replace is how a Cluster API owner heals its machines, found by hub run --kubernetes --discover, not a class of BMC machines: want reboot or fence`},
		{"unknown class", "cluster: c\nclasses: {}\n" + machine(""), `machines[0] (m1).class: "cp" is not defined under classes`},
		{"duplicate name", head + machine("") + "  - {name: m1, class: cp, bmc: {endpoint: \"ipmi://h\", credentials: " + creds + "}}\n",
			`machines[1].name: "m1" is listed twice`},
		{"duplicate member", head + machine("") + "  - {name: m2, member: e1, class: cp, bmc: {endpoint: \"ipmi://h\", credentials: " + creds + "}}\n",
			`machines[1] (m2).member: etcd member "e1" belongs to another machine too`},
		{"bad endpoint", head + "machines:\n  - {name: m1, class: cp, bmc: {endpoint: \"bmc.local\", credentials: " + creds + "}}\n",
			"machines[0] (m1).bmc.endpoint: BMC endpoint"},
		{"no credentials", head + "machines:\n  - {name: m1, class: cp, bmc: {endpoint: \"ipmi://h\"}}\n", "machines[0] (m1).bmc.credentials: required"},
		{"missing credentials file", head + "machines:\n  - {name: m1, class: cp, bmc: {endpoint: \"ipmi://h\", credentials: /nonexistent}}\n",
			"machines[0] (m1).bmc.credentials: BMC credentials: stat /nonexistent"},
		{"bad limit", "cluster: c\npolicy: {maxInFlight: lots}\nclasses: {cp: {strategy: reboot}}\n" + machine(""), `policy.maxInFlight: limit "lots"`},
		{"bad timeout", "cluster: c\npolicy: {probeTimeouts: {kubelet: 0s}}\nclasses: {cp: {strategy: reboot}}\n" + machine(""), "policy.probeTimeouts.kubelet: 0s must be positive"},
		{"unknown probe", "cluster: c\npolicy: {probeTimeouts: {kubelt: 10s}}\nclasses: {cp: {strategy: reboot}}\n" + machine(""),
			`policy.probeTimeouts.kubelt: no probe named "kubelt" (known: ` + strings.Join(health.ProbeNames(), ", ") + ")"},
		{"unknown planned work", "cluster: c\npolicy: {plannedWork: [cordoned, upgrade]}\nclasses: {cp: {strategy: reboot}}\n" + machine(""),
			`policy.plannedWork[1]: "upgrade" is no kind of planned work (cordoned, deleting, rollout, nodeMaintenance, kubeadmUpgrade)`},
		{"negative out-of-service", "cluster: c\npolicy: {outOfServiceAfter: -1m}\nclasses: {cp: {strategy: reboot}}\n" + machine(""),
			"policy.outOfServiceAfter: -1m0s must not be negative (0s: never)"},
		{"negative stall tolerance", "cluster: c\npolicy: {stallTolerance: {quorumNeeded: -5s}}\nclasses: {cp: {strategy: reboot}}\n" + machine(""),
			"policy.stallTolerance.quorumNeeded: -5s must not be negative (0s: at once)"},
		{"a stall tolerance's typo", "cluster: c\npolicy: {stallTolerance: {quorumHold: 5s}}\nclasses: {cp: {strategy: reboot}}\n" + machine(""),
			"policy.stallTolerance.quorumHold: unknown field; did you mean quorumHeld?"},
		{"negative component grace", "cluster: c\npolicy: {componentGrace: {quorumHeld: -1m}}\nclasses: {cp: {strategy: reboot}}\n" + machine(""),
			"policy.componentGrace.quorumHeld: -1m0s must not be negative (0s: at once)"},
		{"no machines", head, "machines: none listed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "inv.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tt.body), 0o600))
			_, err := Load(path)
			require.Error(t, err)
			if strings.Contains(tt.want, "%s") {
				tt.want = fmt.Sprintf(tt.want, path)
			}
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), path, "the error names the file")
			assert.NotContains(t, err.Error(), "password=b")
		})
	}
}

func TestInventoryReloadKeepsTheLastGood(t *testing.T) {
	example := exampleInventory(t)
	good, err := os.ReadFile(example)
	require.NoError(t, err)
	path := filepath.Join(filepath.Dir(example), "inv.yaml") // beside the credentials it names
	require.NoError(t, os.WriteFile(path, good, 0o600))
	r, err := NewReloader(path, true)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(good), "class: workers", "class: nowhere", 1)), 0o600))
	err = r.Reload()
	require.ErrorContains(t, err, `machines[3] (worker-1).class: "nowhere" is not defined under classes; keeping the previous inventory`)
	assert.Len(t, r.Current().Machines, 4)
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(good), "cluster: prod-eu1", "cluster: prod-eu2", 1)), 0o600))
	require.NoError(t, r.Reload())
	assert.Equal(t, "prod-eu2", r.Current().Cluster)
}

// policy.plannedWork: all four kinds unless the file says otherwise; [] for none; repeats once.
func TestPlannedWorkPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy       string
		want         []string
		outOfService time.Duration
	}{
		{"{}", []string{WorkCordoned, WorkDeleting, WorkRollout, WorkNodeMaintenance, WorkKubeadmUpgrade}, time.Minute},
		{"{plannedWork: [], outOfServiceAfter: 0s}", []string{}, 0},
		{"{plannedWork: [rollout, cordoned, rollout], outOfServiceAfter: 5m}", []string{WorkRollout, WorkCordoned}, 5 * time.Minute},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "inv.yaml")
			require.NoError(t, os.WriteFile(path, []byte("cluster: c\npolicy: "+tc.policy+"\n"), 0o600))
			inv, err := load(path, false)
			require.NoError(t, err)
			assert.Equal(t, tc.want, inv.Policy.PlannedWork)
			assert.Equal(t, tc.outOfService, inv.Policy.OutOfServiceAfter)
		})
	}
}
