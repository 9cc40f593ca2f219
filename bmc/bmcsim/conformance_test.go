package bmcsim

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests drive the simulator with third-party Redfish clients from Debian, redfishtool and
// python3-sushy, so that it is checked against someone else's reading of the standard.

const simPassword = "conformance-pw"

func startSim(t *testing.T) *Server {
	t.Helper()
	s, err := Start(Config{Username: "admin", Password: simPassword, Systems: []SystemConfig{
		{ID: "1", PowerOnDelay: 50 * time.Millisecond, ShutdownDelay: 50 * time.Millisecond, CycleOffDuration: 50 * time.Millisecond},
		{ID: "2", PowerState: Off},
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func lookTool(t *testing.T, path, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(path)
	require.NoError(t, err, "%s is missing: install Debian's %s (test/run installs it)", path, pkg)
	return p
}

func eventually(t *testing.T, want string, get func() string) {
	t.Helper()
	require.Eventually(t, func() bool { return get() == want }, 3*time.Second, 20*time.Millisecond, "want %s, have %s", want, get())
}

func TestRedfishtool(t *testing.T) {
	tool := lookTool(t, "redfishtool", "redfishtool")
	s := startSim(t)
	run := func(args ...string) string {
		t.Helper()
		base := []string{"-r", s.Addr(), "-u", "admin", "-p", simPassword, "-A", "Session", "-S", "Always", "-T", "5"}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, tool, append(base, args...)...).CombinedOutput()
		require.NoError(t, err, "redfishtool %v: %s", args, out)
		return string(out)
	}
	out := run("Systems", "list")
	assert.Contains(t, out, `"@odata.id": "/redfish/v1/Systems/1"`)
	assert.Contains(t, out, `"@odata.id": "/redfish/v1/Systems/2"`)
	assert.Contains(t, run("Systems", "-I", "1", "get", "-P", "PowerState"), `"PowerState": "On"`)
	assert.Contains(t, run("Systems", "-I", "2", "get", "-P", "PowerState"), `"PowerState": "Off"`)

	run("Systems", "-I", "1", "reset", "ForceOff")
	eventually(t, Off, func() string { return s.PowerState("1") })
	run("Systems", "-I", "2", "reset", "On")
	eventually(t, On, func() string { return s.PowerState("2") })
	run("Systems", "-I", "1", "reset", "PowerCycle")
	eventually(t, On, func() string { return s.PowerState("1") })
	assert.Equal(t, []string{"ForceOff", "PowerCycle"}, s.Resets("1"))
	assert.Contains(t, run("Managers", "-1", "get"), `"ManagerType": "BMC"`)

	// The event log: its LogService and an entry a test logged, as redfishtool walks them.
	s.LogEvent("1", Event{SensorType: "OS Stop/Shutdown", Message: "Run-time critical stop"})
	assert.Contains(t, run("Systems", "-I", "1", "Logs", "list"), `"/redfish/v1/Systems/1/LogServices/SEL"`)
	sel := run("Systems", "-I", "1", "Logs", "-i", "SEL")
	assert.Contains(t, sel, `"LogEntryType": "SEL"`)
	assert.Contains(t, sel, `"@odata.id": "/redfish/v1/Systems/1/LogServices/SEL/Entries"`)
	entries := run("raw", "GET", "/redfish/v1/Systems/1/LogServices/SEL/Entries")
	assert.Contains(t, entries, `"Message": "Run-time critical stop"`)
	assert.Contains(t, entries, `"SensorType": "OS Stop/Shutdown"`)
	assert.Contains(t, run("Chassis", "-I", "1", "get", "-P", "PowerState"), `"PowerState": "On"`)

	// Wrong credentials are refused.
	bad := exec.Command(tool, "-r", s.Addr(), "-u", "admin", "-p", "wrong", "-A", "Session", "-S", "Always", "Systems", "list")
	out2, err := bad.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out2), "401")
}

// sushyScript lists systems, reads power state, resets, and walks managers and chassis with sushy,
// verifying the simulator's certificate with the CA bundle it is given.
const sushyScript = `
import sys, time, sushy
url, user, password, ca = sys.argv[1:5]
s = sushy.Sushy(url + "/redfish/v1", username=user, password=password, verify=ca)
ids = sorted(m.identity for m in s.get_system_collection().get_members())
print("systems", ",".join(ids))
one = s.get_system("/redfish/v1/Systems/1")
print("power", one.power_state.value)
print("allowed", ",".join(sorted(v.value for v in one.get_allowed_reset_system_values())))
one.reset_system(sushy.ResetType.FORCE_OFF)
for _ in range(100):
    one.refresh()
    if one.power_state == sushy.PowerState.OFF:
        break
    time.sleep(0.02)
print("after-off", one.power_state.value)
one.reset_system(sushy.ResetType.ON)
for _ in range(100):
    one.refresh()
    if one.power_state == sushy.PowerState.ON:
        break
    time.sleep(0.02)
print("after-on", one.power_state.value)
print("health", one.status.health.value)
print("manager", s.get_manager_collection().get_members()[0].identity)
print("chassis", ",".join(sorted(c.identity for c in s.get_chassis_collection().get_members())))
`

func TestSushy(t *testing.T) {
	python := lookTool(t, "/usr/bin/python3", "python3-sushy")
	s := startSim(t)
	s.SetHealth("1", "Critical")
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, s.CertPEM(), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", sushyScript, s.URL(), "admin", simPassword, ca)
	// requests lets REQUESTS_CA_BUNDLE override a session's own CA bundle: drop it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REQUESTS_CA_BUNDLE=") && !strings.HasPrefix(kv, "CURL_CA_BUNDLE=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "sushy: %s (install python3-sushy)", out)
	for _, want := range []string{
		"systems 1,2", "power On",
		"allowed ForceOff,ForceRestart,GracefulRestart,GracefulShutdown,Nmi,On,PowerCycle",
		"after-off Off", "after-on On", "health Critical", "manager BMC", "chassis 1,2",
	} {
		assert.Contains(t, string(out), want)
	}
	assert.Equal(t, []string{"ForceOff", "On"}, s.Resets("1"))
	assert.Equal(t, On, s.PowerState("1"))
}
