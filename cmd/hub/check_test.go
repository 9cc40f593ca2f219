package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/test/ipmisim"
)

// `hub check` against real BMCs: the Redfish simulator (one system ready, one missing, a second BMC
// whose account refuses the password, behind which two machines sit), a silent port, a closed port and
// ipmi_sim through ipmitool. One failed login for the refusing account, not two; the silent BMC costs
// the request timeout (twice: one retry), not a minute; exit 2; each -o.
func TestCheck(t *testing.T) {
	r := startSimRig(t)
	sim2, err := bmcsim.Start(bmcsim.Config{Username: "admin", Password: "other-secret",
		Systems: []bmcsim.SystemConfig{{ID: "a"}, {ID: "b"}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sim2.Close() })
	ca2 := filepath.Join(t.TempDir(), "ca2.pem")
	require.NoError(t, os.WriteFile(ca2, sim2.CertPEM(), 0o600))
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = silent.Close() })
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	ipmi := ipmisim.Start(t)
	dir := t.TempDir()
	ipmiCreds := filepath.Join(dir, "ipmi-creds")
	require.NoError(t, os.WriteFile(ipmiCreds, []byte(fmt.Sprintf("username=%s\npassword=%s\n", ipmi.Username, ipmi.Password)), 0o600))
	inv := filepath.Join(dir, "inventory.yaml")
	require.NoError(t, os.WriteFile(inv, []byte(fmt.Sprintf(`cluster: check
classes: {cp: {strategy: reboot}}
machines:
  - {name: cp-0, member: etcd-0, class: cp, bmc: {endpoint: "%[1]s/systems/1", credentials: %[2]s, caFile: %[3]s}}
  - {name: cp-1, member: etcd-1, class: cp, bmc: {endpoint: "%[1]s/systems/9", credentials: %[2]s, caFile: %[3]s}}
  - {name: cp-2, member: etcd-2, class: cp, bmc: {endpoint: "%[4]s/systems/a", credentials: %[2]s, caFile: %[5]s}}
  - {name: cp-3, member: etcd-3, class: cp, bmc: {endpoint: "%[4]s/systems/b", credentials: %[2]s, caFile: %[5]s}}
  - {name: cp-4, member: etcd-4, class: cp, bmc: {endpoint: "redfish://%[6]s", credentials: %[2]s}}
  - {name: cp-5, member: etcd-5, class: cp, bmc: {endpoint: "redfish://%[7]s", credentials: %[2]s}}
  - {name: cp-6, member: etcd-6, class: cp, bmc: {endpoint: "%[8]s", credentials: %[9]s}}
`, r.sim.Endpoint(), r.creds, r.ca, sim2.Endpoint(), ca2, silent.Addr(), closed.Addr(), ipmi.Endpoint(), ipmiCreds)), 0o600))

	start := time.Now()
	out, errOut, code := hubRun(t, "check", "--inventory", inv, "--bmc-request-timeout", "1s")
	took := time.Since(start)
	t.Logf("hub check (%v):\n%s%s", took.Round(10*time.Millisecond), out, errOut)
	assert.Equal(t, exitBMCFailed, code)
	assert.Less(t, took, 6*time.Second, "the silent BMC costs its request timeout twice, and the BMCs are checked side by side")
	want := map[string]string{"cp-0": "yes  On  -", "cp-1": "NO   -      NoSuchSystem", "cp-2": "NO   -      LoginRefused", "cp-3": "NO   -      LoginRefused",
		"cp-4": "NO   -      Unreachable", "cp-5": "NO   -      Unreachable", "cp-6": "yes  On  -"}
	for m, cells := range want {
		assert.Regexp(t, `(?m)^`+m+`\s+\S+\s+`+strings.ReplaceAll(regexpQuote(cells), " ", `\s+`)+`\s*$`, out, m)
	}
	assert.Contains(t, errOut, "5 of 7 BMCs not ready: cp-1, cp-2, cp-3, cp-4, cp-5")
	assert.Equal(t, 1, sim2.FailedLogins(), "one failed login for the account that refuses the password, not one per machine")
	assert.Contains(t, out, "cp-3: "+sim2.Endpoint()+`/systems/b status: not tried: the BMC refused the login of user "admin" for cp-2 just before`)
	assert.Contains(t, out, "cp-4: redfish://"+silent.Addr().String()+" status: BMC unreachable: connect: no answer within 1s")

	out, _, code = hubRun(t, "check", "--inventory", inv, "--bmc-request-timeout", "1s", "-o", "json")
	assert.Equal(t, exitBMCFailed, code)
	var rows []struct {
		Machine, Endpoint string
		Ready             bool
		Problem           bmc.Problem
		Power             bmc.PowerState
		Error             string
		Checked           time.Time
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Len(t, rows, 7)
	assert.Equal(t, bmc.PowerOn, rows[0].Power)
	assert.Equal(t, bmc.ProblemNoSystem, rows[1].Problem)
	assert.False(t, rows[1].Checked.IsZero())

	out, _, _ = hubRun(t, "check", "--inventory", inv, "--bmc-request-timeout", "1s", "-o", "yaml")
	assert.Contains(t, out, "- checked: ")
	assert.Contains(t, out, "problem: NoSuchSystem")
	out, _, _ = hubRun(t, "check", "--inventory", inv, "--bmc-request-timeout", "1s", "-o", "wide")
	assert.Regexp(t, `(?m)^MACHINE\s+BMC\s+READY\s+POWER\s+PROBLEM\s+ERROR$`, out)

	for _, tt := range []struct {
		name string
		args []string
		says string
	}{
		{"no inventory flag", []string{"check"}, "--inventory is required"},
		{"a missing file", []string{"check", "--inventory", filepath.Join(dir, "nope.yaml")}, "nope.yaml"},
		{"an unknown output", []string{"check", "--inventory", inv, "-o", "xml"}, `-o "xml": want table, wide, json or yaml`},
		{"a bad timeout", []string{"check", "--inventory", inv, "--bmc-request-timeout", "0s"}, "both must be positive"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := hubRun(t, tt.args...)
			assert.Equal(t, exitUsage, code)
			assert.Contains(t, errOut, tt.says)
			assert.Empty(t, out, "nothing checked")
		})
	}
}

func regexpQuote(s string) string {
	return strings.NewReplacer("(", `\(`, ")", `\)`, ".", `\.`).Replace(s)
}

// `hub check` of 50 machines, each behind a BMC of its own (the Redfish simulator), one of them
// silent: the check takes about the silent BMC's request timeout twice (one retry), not 50 of
// anything; the others are checked side by side meanwhile. Reports the seconds a check took and that
// bound.
//
//	go test -run '^$' -bench Check50 -benchtime 3x ./cmd/hub
func BenchmarkCheck50BMCsOneSilent(b *testing.B) {
	dir := b.TempDir()
	creds := filepath.Join(dir, "creds")
	require.NoError(b, os.WriteFile(creds, []byte("username=admin\npassword=pw\n"), 0o600))
	var machines strings.Builder
	for i := range 49 {
		sim, err := bmcsim.Start(bmcsim.Config{Username: "admin", Password: "pw", PlainHTTP: true, Systems: []bmcsim.SystemConfig{{ID: "1"}}})
		require.NoError(b, err)
		b.Cleanup(func() { _ = sim.Close() })
		fmt.Fprintf(&machines, "  - {name: m-%02d, class: w, bmc: {endpoint: %q, credentials: %s}}\n", i, sim.Endpoint()+"/systems/1", creds)
	}
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	b.Cleanup(func() { _ = silent.Close() })
	fmt.Fprintf(&machines, "  - {name: m-49, class: w, bmc: {endpoint: \"redfish+http://%s\", credentials: %s}}\n", silent.Addr(), creds)
	inv := filepath.Join(dir, "inventory.yaml")
	require.NoError(b, os.WriteFile(inv, []byte("cluster: bench\nclasses: {w: {strategy: reboot}}\nmachines:\n"+machines.String()), 0o600))

	const timeout = 2 * time.Second
	var took time.Duration
	for b.Loop() {
		start := time.Now()
		_, errOut, code := hubRun(b, "check", "--inventory", inv, "--request-timeout", timeout.String())
		took = time.Since(start)
		if code != exitBMCFailed || !strings.Contains(errOut, "1 of 50 BMCs not ready: m-49") {
			b.Fatalf("exit %d: %s", code, errOut)
		}
	}
	b.ReportMetric(took.Seconds(), "s/check")
	b.ReportMetric((2 * timeout).Seconds(), "bound-s")
}
