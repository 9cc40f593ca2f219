package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc/bmcsim"
)

type simRig struct {
	sim   *bmcsim.Server
	creds string
	ca    string
}

func startSimRig(t *testing.T) simRig {
	t.Helper()
	sim, err := bmcsim.Start(bmcsim.Config{Username: "admin", Password: "cli-secret-pw",
		Systems: []bmcsim.SystemConfig{{ID: "1", ShutdownDelay: 50 * time.Millisecond, CycleOffDuration: 50 * time.Millisecond}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sim.Close() })
	dir := t.TempDir()
	r := simRig{sim: sim, creds: filepath.Join(dir, "creds"), ca: filepath.Join(dir, "ca.pem")}
	require.NoError(t, os.WriteFile(r.creds, []byte("username=admin\npassword=cli-secret-pw\n"), 0o600))
	require.NoError(t, os.WriteFile(r.ca, sim.CertPEM(), 0o600))
	return r
}

// hubRun runs hub in-process and returns stdout, stderr and the exit code main would use.
func hubRun(t testing.TB, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand(&out, &errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	if err != nil {
		errOut.WriteString("hub: " + err.Error() + "\n")
	}
	assert.NotContains(t, out.String()+errOut.String(), "cli-secret-pw", "the password was printed")
	return out.String(), errOut.String(), exitCode(err)
}

func TestBMCPower(t *testing.T) {
	r := startSimRig(t)
	ep := r.sim.Endpoint()
	flags := []string{"--credentials", r.creds, "--ca-file", r.ca, "--timeout", "20s", "--graceful-timeout", "5s"}
	run := func(args ...string) (string, string, int) {
		return hubRun(t, append(append([]string{"bmc", "power"}, args...), flags...)...)
	}

	out, _, code := run("status", ep)
	assert.Equal(t, exitOK, code)
	assert.Equal(t, ep+": On\n", out)

	out, _, code = run("off", ep)
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "power off done")
	assert.Contains(t, out, "sent:     GracefulShutdown")
	assert.Contains(t, out, "verified: Off observed after GracefulShutdown")
	assert.Equal(t, "Off", r.sim.PowerState("1"))

	out, _, code = run("off", ep)
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "power off nothing to do")

	out, _, code = run("cycle", ep, "-o", "json")
	assert.Equal(t, exitOK, code)
	var doc struct {
		Result struct {
			Before, After string
			Requests      []string
		}
		Error string
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.Equal(t, "Off", doc.Result.Before)
	assert.Equal(t, "On", doc.Result.After)
	assert.Equal(t, []string{"On"}, doc.Result.Requests, "a machine that is off is powered on")
	assert.Empty(t, doc.Error)

	out, _, code = run("reboot", ep)
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "verified: Off then On observed after GracefulRestart")
}

func TestBMCPowerExitCodes(t *testing.T) {
	r := startSimRig(t)
	ep := r.sim.Endpoint()
	dir := t.TempDir()
	wrong := filepath.Join(dir, "wrong")
	require.NoError(t, os.WriteFile(wrong, []byte("username=admin\npassword=nope\n"), 0o600))

	t.Run("bad input is 1 and names the problem", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"bmc", "power", "explode", ep, "--credentials", r.creds}, `power "explode": want status, on, off, force-off, cycle or reboot`},
			{[]string{"bmc", "power", "status", "bmc.example", "--credentials", r.creds}, "want redfish://host[:port]"},
			{[]string{"bmc", "power", "status", ep}, "no BMC credentials: give --credentials FILE, or set HALE_BMC_USERNAME and HALE_BMC_PASSWORD"},
			{[]string{"bmc", "power", "status", ep, "--credentials", filepath.Join(dir, "missing")}, "BMC credentials: stat"},
			{[]string{"bmc", "power", "status", ep, "--credentials", r.creds, "-o", "text"}, `-o "text": want table, wide, json or yaml`},
			{[]string{"bmc", "power", "status", "cp-0"}, "(or, to name a machine, give the hub's --inventory)"},
		} {
			_, stderr, code := hubRun(t, tc.args...)
			assert.Equal(t, exitUsage, code, tc.args)
			assert.Contains(t, stderr, tc.want)
		}
	})
	t.Run("wrong password is 2 and says check the credentials", func(t *testing.T) {
		_, stderr, code := hubRun(t, "bmc", "power", "off", ep, "--credentials", wrong, "--ca-file", r.ca)
		assert.Equal(t, exitBMCFailed, code)
		assert.Contains(t, stderr, "check the credentials")
		assert.Equal(t, "On", r.sim.PowerState("1"))
	})
	t.Run("untrusted certificate is 2 and says how to trust it", func(t *testing.T) {
		_, stderr, code := hubRun(t, "bmc", "power", "status", ep, "--credentials", r.creds)
		assert.Equal(t, exitBMCFailed, code)
		assert.Contains(t, stderr, "--ca-file")
	})
	t.Run("accepted but never done is 3", func(t *testing.T) {
		r.sim.SetFaults(bmcsim.Faults{IgnoreResets: true})
		defer r.sim.SetFaults(bmcsim.Faults{})
		// 3 s: with 1 s a loaded run cut the request reading the system short (unreachable, exit 2).
		out, stderr, code := hubRun(t, "bmc", "power", "cycle", ep, "--credentials", r.creds, "--ca-file", r.ca, "--timeout", "3s")
		assert.Equal(t, exitUnverified, code)
		assert.Contains(t, out, "power cycle NOT VERIFIED")
		assert.Contains(t, stderr, "could not verify")
	})
	t.Run("credentials from the environment", func(t *testing.T) {
		t.Setenv("HALE_BMC_USERNAME", "admin")
		t.Setenv("HALE_BMC_PASSWORD", "cli-secret-pw")
		out, _, code := hubRun(t, "bmc", "power", "status", ep, "--ca-file", r.ca, "-o", "json")
		assert.Equal(t, exitOK, code)
		assert.Contains(t, out, `"powerState": "On"`)
	})
}

// A BMC that takes the connection (or the packet) and never answers costs a status read its request
// timeout per try (two tries), whatever the protocol; and a command whose own --timeout runs out first
// says that, not the request timeout it never reached.
func TestBMCPowerSilentBMC(t *testing.T) {
	creds := filepath.Join(t.TempDir(), "creds")
	require.NoError(t, os.WriteFile(creds, []byte("username=admin\npassword=cli-secret-pw\n"), 0o600))
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer tcp.Close()
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer udp.Close()
	for _, tc := range []struct {
		name, endpoint string
		flags          []string
		says           string
		atMost         time.Duration
	}{
		{"Redfish, 1 s a request", "redfish+http://" + tcp.Addr().String(), []string{"--bmc-request-timeout", "1s"}, "no answer within 1s", 5 * time.Second},
		{"IPMI, 1 s a call", "ipmi://" + udp.LocalAddr().String(), []string{"--bmc-request-timeout", "1s"}, "within 1s", 5 * time.Second},
		{"the command's --timeout first", "redfish+http://" + tcp.Addr().String(), []string{"--timeout", "1500ms"},
			"no answer before the operation's deadline ran out", 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, stderr, code := hubRun(t, append([]string{"bmc", "power", "status", tc.endpoint, "--credentials", creds}, tc.flags...)...)
			took := time.Since(start)
			assert.NotZero(t, code, stderr)
			assert.Contains(t, stderr, tc.says)
			assert.Less(t, took, tc.atMost, "a silent BMC cost %v: %s", took, stderr)
			t.Logf("%s: %v: %s", tc.name, took.Round(10*time.Millisecond), stderr)
		})
	}
}
