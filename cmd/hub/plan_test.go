package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand(&out, &errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func writeState(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.yaml")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

func TestPlanExamples(t *testing.T) {
	tests := []struct {
		file string
		want []string
	}{
		{"../../examples/quorum-lost.yaml", []string{
			"etcd now:        quorum lost: 1 of 3 voters healthy, quorum needs 2",
			"cp-3     etcd-3  reboot    start     free: etcd-3 is not a healthy voter",
			"steps: power-cycle etcd-2 → await-healthy etcd-2",
		}},
		{"../../examples/replace-in-flight.yaml", []string{
			"cp-1     etcd-1  replace   in-flight  replace in flight",
			"cp-3     etcd-3  fence     wait       fencing etcd-3 is unsafe beside the work in flight: in one order of their steps, " +
				"after promote etcd-3 → remove etcd-1 (cp-1's replace), fencing etcd-3 (cp-3's fence) leaves 1 of 2 voters healthy; quorum needs 2",
		}},
		{"../../examples/fleet.yaml", []string{
			"etcd now:        3 of 3 voters healthy, quorum 2, tolerates 1, budget 1",
			"cp-1      etcd-1  reboot    start     costs 1 of a budget of 1",
			"cp-2      etcd-2  reboot    wait      rebooting etcd-2 leaves 1 of 3 voters healthy; quorum needs 2",
			"worker-2  -       reboot    wait      pool workers: 1 remediation(s) in flight, maxInFlight 1 of 5 machines allows 1",
		}},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.file), func(t *testing.T) {
			out, err := runCLI(t, "plan", "-f", tt.file)
			require.NoError(t, err)
			for _, want := range tt.want {
				assert.Contains(t, out, want)
			}
		})
	}
}

func TestPlanJSON(t *testing.T) {
	out, err := runCLI(t, "plan", "-f", "../../examples/fleet.yaml", "-o", "json")
	require.NoError(t, err)
	var doc struct {
		Budget    struct{ Available int }
		Decisions []struct {
			Machine, Decision string
			Steps             []string
			Cost              int
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.Equal(t, 1, doc.Budget.Available)
	require.Len(t, doc.Decisions, 4)
	assert.Equal(t, "cp-1", doc.Decisions[0].Machine)
	assert.Equal(t, "start", doc.Decisions[0].Decision)
	assert.Equal(t, []string{"power-cycle etcd-1", "await-healthy etcd-1"}, doc.Decisions[0].Steps)
	assert.Equal(t, 1, doc.Decisions[0].Cost)
	assert.Equal(t, "wait", doc.Decisions[1].Decision)
}

func TestPlanBadInput(t *testing.T) {
	members := "members:\n  - {name: etcd-1, health: healthy}\n"
	tests := []struct {
		name string
		body string
		args []string
		want string
	}{
		{name: "no file", args: []string{"plan"}, want: "plan: -f STATE.yaml is required (see examples/)"},
		{name: "bad output", args: []string{"plan", "-f", "x", "-o", "xml"}, want: `plan: -o "xml": want table, wide, json or yaml`},
		{name: "missing file", args: []string{"plan", "-f", "/nonexistent/state.yaml"}, want: "reading state: open /nonexistent/state.yaml: no such file or directory"},
		{name: "unknown field", body: members + "machines:\n  - {name: cp-1, helth: bad}\n", want: `unknown field "helth"`},
		{name: "no members", body: "machines: []\n", want: "members: none listed"},
		{name: "bad health", body: "members:\n  - {name: etcd-1, health: sick}\n", want: `members[0].health: "sick" is not one of [healthy unhealthy unknown]`},
		{name: "missing health", body: "members:\n  - {name: etcd-1}\n", want: "members[0].health: missing; want one of [healthy unhealthy unknown]"},
		{name: "nameless member", body: "members:\n  - {health: healthy}\n", want: "members[0].name: missing"},
		{name: "bad strategy", body: members + "machines:\n  - {name: cp-1, strategy: nuke}\n", want: `machines[0].strategy: "nuke" is not one of [fence reboot replace]`},
		{name: "bad since", body: members + "machines:\n  - {name: cp-1, since: yesterday}\n", want: `machines[0].since: "yesterday" is not an RFC 3339 time`},
		{name: "replace without new member", body: members + "machines:\n  - {name: cp-1, strategy: replace}\n", want: "machines[0].replace.newMember: a replace needs the new member's name"},
		{name: "bad order", body: members + "machines:\n  - {name: cp-1, strategy: replace, replace: {newMember: e, orders: [sideways]}}\n", want: `machines[0].replace.orders[0]: "sideways" is not one of [scale-down-first scale-up-first]`},
		{name: "bad limit", body: "policy: {maxInFlight: lots}\n" + members, want: `policy.maxInFlight: limit "lots": want a count`},
		{name: "the old spelling is named", body: "policy: {pools: {maxInFlight: \"1\"}}\n" + members, want: `pools`},
		{name: "bad policy", body: "policy: {minFaultTolerance: -1}\n" + members, want: "policy.minFaultTolerance: -1 is negative"},
		{name: "bad remaining step", body: members + "machines:\n  - {name: cp-1, member: etcd-1, inFlight: true, remaining: [reboot etcd-1]}\n",
			want: `machines[0].remaining[0]: step "reboot etcd-1": want an operation and a member`},
		{name: "remaining without inFlight", body: members + "machines:\n  - {name: cp-1, member: etcd-1, remaining: [await-healthy etcd-1]}\n",
			want: "machines[0].remaining: only a machine with inFlight: true has steps still to come"},
		{name: "duplicate machine", body: members + "machines:\n  - {name: cp-1}\n  - {name: cp-1}\n", want: `machine "cp-1" is listed twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			var path string
			if args == nil {
				path = writeState(t, tt.body)
				args = []string{"plan", "-f", path}
			}
			_, err := runCLI(t, args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			if path != "" && tt.name != "no file" {
				assert.Contains(t, err.Error(), path, "the error names the file")
			}
		})
	}
}
