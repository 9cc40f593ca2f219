package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/bmcaccess"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/lab/inproc"
)

// writeInventory writes the in-process cluster's inventory at the in-process pace: a 1-s cooldown,
// and 5 s of stall tolerance and component grace (these tests are of what follows a verdict; the
// shipped waits are test/lab's stall matrix's). With 1 s, a loaded run's in-process gossip once saw
// cp-2 dead for 4 s, and the hub power-cycled it: the test's metrics counted a heal too many.
func writeInventory(t *testing.T, path string, tb *inproc.Cluster, extra string) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: demo\npolicy: {cooldown: 1s, etcdUnreachableTimeout: 1s, stallTolerance: {quorumHeld: 5s, quorumNeeded: 5s}, "+
		"componentGrace: {quorumHeld: 5s, quorumNeeded: 5s}%s}\nclasses: {cp: {strategy: reboot}}\nmachines:\n", extra)
	for i := range inproc.Machines {
		fmt.Fprintf(&b, "  - {name: %s, member: etcd-%d, class: cp, bmc: {endpoint: %q, credentials: %s}}\n",
			inproc.Name(i), i, tb.Sim().Endpoint()+"/systems/"+inproc.Name(i), tb.CredentialsFile())
	}
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
}

// startBed starts the demo topology under dir (stopped when the test ends) and writes its inventory
// file; it returns both.
func startBed(t *testing.T, dir string) (*inproc.Cluster, string) {
	t.Helper()
	tb, err := inproc.Start(inproc.Options{Dir: filepath.Join(dir, "bed")})
	require.NoError(t, err)
	t.Cleanup(tb.Close)
	inv := filepath.Join(dir, "inventory.yaml")
	writeInventory(t, inv, tb, "")
	return tb, inv
}

// `hub run` on the demo topology, driven by the operator commands over its socket and its token-
// guarded TCP API: status, explain, dry-run reboot, detach, pause --wait, a hung machine healed, a bad
// inventory reload refused with the field named and the previous inventory kept, metrics served.
func TestRunAndOperatorCommands(t *testing.T) {
	dir := t.TempDir()
	tb, inv := startBed(t, dir)
	token := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o600))
	socket := filepath.Join(dir, "run", "hub.sock")

	logs := &capture.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan runAddrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- runHub(ctx, runOptions{inventory: inv, journal: filepath.Join(dir, "journal.db"), node: "hub", bind: "127.0.0.1:0",
			join: tb.Seeds(), keyFile: tb.GossipKeyFile(), identityFile: tb.HubIdentityFile(), pinnedFile: tb.PinnedKeysFile(), api: apiListen{socket: socket, address: "127.0.0.1:0", tokenFile: token},
			metrics: "127.0.0.1:0", logLevel: "info", keep: 20, bmcCheckEvery: time.Hour}, logs, ready)
	}()
	var addrs runAddrs
	select {
	case addrs = <-ready:
	case err := <-done:
		t.Fatalf("hub run: %v\n%s", err, logs)
	}
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		if t.Failed() {
			t.Logf("hub logs:\n%s", logs)
		}
	})
	fi, err := os.Stat(socket)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the socket is the owner's only")

	cli := func(args ...string) (string, int) {
		var out bytes.Buffer
		root := newRootCommand(&out, &out)
		root.SetIn(strings.NewReader(""))
		root.SetArgs(append(args, "--socket", socket))
		err := root.ExecuteContext(context.Background())
		if err != nil {
			out.WriteString(err.Error())
		}
		return out.String(), exitCode(err)
	}
	require.Eventually(t, func() bool {
		out, code := cli("status")
		return code == 0 && strings.Count(out, "Healthy") == 3 && strings.Contains(out, "budget 1")
	}, 30*time.Second, 100*time.Millisecond)

	out, code := cli("status")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "a strict majority: acting")
	out, code = cli("status", "-o", "json")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, `"pause": "Running"`)
	out, code = cli("status", "-o", "yaml")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "pause: Running\n")
	out, code = cli("status", "-o", "foo")
	assert.Equal(t, exitUsage, code)
	assert.Equal(t, `-o "foo": want table, wide, json or yaml`, out)
	// Every BMC was checked when the hub started leading.
	require.Eventually(t, func() bool {
		out, _ := cli("status", "-o", "wide")
		return strings.Count(out, " ready ") == 3
	}, 30*time.Second, 100*time.Millisecond)
	// The BMC account's password changed on the BMC: `hub check --now` finds it at once (one failed
	// login). Put right on the BMC, the hub would wait minutes before its next login to that account;
	// `hub check --now` tries once more, and status shows every BMC ready.
	failedBefore := tb.Sim().FailedLogins()
	tb.Sim().SetFaults(bmcsim.Faults{RejectAuth: true})
	out, code = cli("check", "--now")
	assert.Equal(t, exitBMCFailed, code, out)
	assert.Contains(t, out, "checked now, 3 machines")
	assert.Equal(t, 3, strings.Count(out, "LoginRefused"), out)
	assert.Equal(t, failedBefore+1, tb.Sim().FailedLogins(), "one failed login for the one account")
	tb.Sim().SetFaults(bmcsim.Faults{})
	out, code = cli("check", "--now", "-o", "json")
	assert.Equal(t, 0, code, out)
	var checks []bmcaccess.BMCCheck
	require.NoError(t, json.Unmarshal([]byte(out), &checks), out)
	require.Len(t, checks, 3)
	for _, c := range checks {
		assert.True(t, c.Ready, "%+v", c)
	}
	out, _ = cli("status", "-o", "wide")
	assert.Equal(t, 3, strings.Count(out, " ready "), out)
	_, code = cli("check", "--now", "--inventory", inv)
	assert.Equal(t, exitUsage, code)
	// askUntil runs a command every second until done takes its answer, for at most within, and
	// returns its last answer: a loaded machine's in-process rig can leave the hub without a fresh etcd
	// view for seconds ("not planning: no fresh etcd view from any agent", 2026-12-05), when it plans
	// nothing, cannot tell whether quorum is lost, and refuses a reboot; the operator asks again.
	askUntil := func(within time.Duration, done func(out string, code int) bool, args ...string) (string, int) {
		for deadline := time.Now().Add(within); ; time.Sleep(time.Second) {
			out, code := cli(args...)
			if done(out, code) || time.Now().After(deadline) {
				return out, code
			}
			t.Logf("%s: asked again: %s", strings.Join(args, " "), out)
		}
	}
	// settled asks until the answer says want, as the hub answers of a settled cluster.
	settled := func(want string, args ...string) (string, int) {
		return askUntil(30*time.Second, func(out string, _ int) bool { return strings.Contains(out, want) }, args...)
	}
	// A recovery plan while etcd holds quorum: not ready, and says why (exit 2).
	out, code = settled("etcd's quorum is not lost", "recover")
	assert.Equal(t, exitRefused, code, out)
	assert.Contains(t, out, "etcd's quorum is not lost: there is nothing to recover")
	assert.Contains(t, out, "survivor: etcd-")
	out, code = settled("planner: nothing to do", "explain", "cp-1")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "etcd member etcd-1: voter, healthy")
	assert.Contains(t, out, "bmc: ready (power On, health OK), checked at ")
	assert.Contains(t, out, "planner: nothing to do: the machine is healthy")
	// The same explanation as data: -o json and -o yaml.
	out, code = settled(`"planner": "nothing to do`, "explain", "cp-1", "-o", "json")
	require.Equal(t, 0, code, out)
	var e operator.Explanation
	require.NoError(t, json.Unmarshal([]byte(out), &e), out)
	assert.Equal(t, "cp-1", e.Machine.Name)
	assert.Equal(t, assess.VerdictHealthy, e.Machine.Verdict)
	assert.Equal(t, "nothing to do: the machine is healthy", e.Planner)
	assert.True(t, e.Machine.BMC.Ready)
	out, code = settled("planner: 'nothing to do", "explain", "cp-1", "-o", "yaml")
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "planner: 'nothing to do: the machine is healthy'")
	_, code = cli("explain", "cp-1", "-o", "xml")
	assert.Equal(t, exitUsage, code)
	// Shell completion of a MACHINE asks the hub.
	t.Setenv("HALE_HUB_SOCKET", socket)
	var comp bytes.Buffer
	root := newRootCommand(&comp, io.Discard)
	root.SetArgs([]string{"__complete", "explain", ""})
	require.NoError(t, root.Execute())
	// Each machine with its verdict as the hub has it now (a loaded machine may see one flicker Suspect).
	assert.Regexp(t, `^cp-0\t(Healthy|Suspect)\ncp-1\t(Healthy|Suspect)\ncp-2\t(Healthy|Suspect)\n:4\n$`, strings.SplitAfter(comp.String(), ":4\n")[0])
	out, code = cli("explain", "cp-9")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, out, `machine "cp-9": not in the inventory`)
	// While the hub hears no majority for a moment (a loaded machine's gossip on loopback can miss acks)
	// it refuses a reboot, as it cannot check quorum; the operator tries again.
	reboot := func(args ...string) (string, int) {
		return askUntil(time.Minute, func(out string, code int) bool {
			return code != exitRefused || !strings.Contains(out, "cannot check quorum")
		}, append([]string{"reboot"}, args...)...)
	}
	out, code = reboot("cp-1", "--dry-run")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "dry run: would power-cycle etcd-1 → await-healthy etcd-1")
	out, code = cli("reboot", "cp-1", "--force")
	assert.Equal(t, exitUsage, code, "--force without typing the name: not confirmed")
	assert.Contains(t, out, "not confirmed: nothing done")

	_, code = cli("detach", "cp-1")
	require.Equal(t, 0, code)
	out, code = cli("reboot", "cp-1")
	assert.Equal(t, exitRefused, code)
	assert.Contains(t, out, "cp-1: detached by")
	out, _ = cli("status")
	assert.Contains(t, out, "Healthy (Detached)")
	_, code = cli("attach", "cp-1")
	require.Equal(t, 0, code)

	// By name, with the hub's inventory: a machine the hub manages is not taken down by hand unless it
	// is detached (the hub would power it back on); reading its power is fine.
	out, code = cli("bmc", "power", "status", "cp-2", "--inventory", inv)
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "/systems/cp-2: On")
	out, code = cli("bmc", "power", "off", "cp-2", "--inventory", inv)
	assert.Equal(t, exitRefused, code, out)
	assert.Contains(t, out, "cp-2 is managed by the running hub ("+socket+"): taken down by hand it would be found Unhealthy")
	assert.Contains(t, out, "hub detach cp-2")
	out, code = cli("bmc", "power", "off", "cp-7", "--inventory", inv)
	assert.Equal(t, exitUsage, code, out)
	assert.Contains(t, out, `machine "cp-7" is not in `+inv+" (it has cp-0, cp-1, cp-2)")
	assert.Empty(t, tb.Resets(2))

	out, code = cli("pause", "--wait", "--timeout", "10s")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "Paused")
	// (the hub may hear no majority for a moment, as above)
	require.Eventually(t, func() bool {
		out, _ := cli("status")
		return strings.Contains(out, "a strict majority, but paused: nothing new starts")
	}, 30*time.Second, 200*time.Millisecond)
	out, _ = cli("status")
	assert.NotContains(t, out, ": acting", "never \"acting\" while paused")
	_, code = cli("resume")
	require.Equal(t, 0, code)

	// A manual reboot, followed to its end through GET /v1/remediations/ID.
	out, code = reboot("cp-0", "--wait")
	assert.Equal(t, 0, code, out)
	assert.Regexp(t, `remediation cp-0/\S+: Succeeded, reboot, requested by`, out)
	assert.Len(t, tb.Resets(0), 1)

	// The TCP API wants the token.
	require.Len(t, addrs.API, 2)
	resp, err := http.Get("http://" + addrs.API[1] + "/v1/status")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	var tcpOut bytes.Buffer
	root = newRootCommand(&tcpOut, &tcpOut)
	root.SetArgs([]string{"status", "--api-address", addrs.API[1], "--token-file", token})
	require.NoError(t, root.Execute())
	assert.Contains(t, tcpOut.String(), "cluster demo")

	// A hung machine is healed by the daemon.
	tb.Hang(2)
	require.Eventually(t, func() bool {
		out, _ := cli("explain", "cp-2")
		return strings.Contains(out, "Succeeded, reboot, requested by hub")
	}, 60*time.Second, 200*time.Millisecond)
	assert.Len(t, tb.Resets(2), 1)

	// A bad inventory on SIGHUP: the error names the field; the previous inventory stays in force.
	require.NoError(t, os.WriteFile(inv, []byte("cluster: demo\nmachines:\n  - {name: cp-0, class: nope}\n"), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "inventory reload failed") }, 5*time.Second, 50*time.Millisecond)
	assert.Contains(t, logs.String(), `machines[0] (cp-0).class: \"nope\" is not defined under classes; keeping the previous inventory`)
	out, _ = cli("status")
	// (its machines' rows: a row's reasons may name an etcd member too)
	assert.Len(t, regexp.MustCompile(`(?m)^cp-\d+ `).FindAllString(out, -1), 3, "the previous inventory is in force:\n%s", out)
	// A good one is put in force.
	writeInventory(t, inv, tb, ", maxAttempts: 5")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "inventory reloaded: 3 machines") }, 5*time.Second, 50*time.Millisecond)

	// Metrics. The gauges are of the pass's last view, which a loaded machine may see without a budget
	// for a moment (a hearing short of its majority): scraped again until every line is there.
	wants := []string{`hale_hub_machines{verdict="Healthy"}`, "hale_hub_etcd_voters 3", `hale_hub_remediations_total{requested_by="hub",result="succeeded",strategy="reboot"} 1`,
		`hale_hub_remediations_total{requested_by="operator",result="succeeded",strategy="reboot"} 1`,
		"hale_hub_detection_to_action_seconds_count 1", `hale_bmc_calls_total{call="reboot",driver="redfish",result="ok"} 2`, `hale_hub_paused{state="Running"} 1`,
		`hale_hub_gossip_rejected_total{reason="not_sender"} 0`, "hale_hub_gossip_key_order_errors_total 0", "hale_hub_bmc_login_waits 0",
		`hale_hub_machines_needing_operator{reason="GaveUp"} 0`}
	var body []byte
	var missing []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err = http.Get("http://" + addrs.Metrics + "/metrics")
		require.NoError(t, err)
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		missing = missing[:0]
		for _, want := range wants {
			if !strings.Contains(string(body), want) {
				missing = append(missing, want+"; the hub serves:\n"+metricFamily(string(body), want))
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if !assert.Empty(t, missing, "metrics missing for 20 s") {
		out, _ := cli("status")
		t.Logf("hub status:\n%s", out)
	}
	// Prometheus's own linter on what the hub serves: names, units, help text.
	lint, err := promtool(t, string(body), "check", "metrics")
	assert.NoError(t, err, "promtool check metrics:\n%s", lint)
	// The BMC password reaches neither logs, metrics, status nor explain.
	creds, err := os.ReadFile(tb.CredentialsFile())
	require.NoError(t, err)
	_, password, _ := strings.Cut(strings.TrimSpace(string(creds)), "password=")
	require.NotEmpty(t, password)
	status, _ := cli("status", "-o", "json")
	explain, _ := cli("explain", "cp-2")
	for what, text := range map[string]string{"metrics": string(body), "logs": logs.String(), "status": status, "explain": explain} {
		assert.NotContains(t, text, password, what)
	}
}

// Two standalone hubs on one gossip pool, each with a journal of its own: the one that started first
// leads, the other stands by and says so (one remediation, one power action, for a hung machine); when
// the leader stops, the other leads.
func TestSecondStandaloneHubStandsBy(t *testing.T) {
	dir := t.TempDir()
	tb, inv := startBed(t, dir)
	type proc struct {
		socket string
		cancel context.CancelFunc
		done   chan error
		logs   *capture.Buffer
	}
	start := func(name string) *proc {
		p := &proc{socket: filepath.Join(dir, name+".sock"), done: make(chan error, 1), logs: &capture.Buffer{}}
		ctx, cancel := context.WithCancel(context.Background())
		p.cancel = cancel
		ready := make(chan runAddrs, 1)
		go func() {
			p.done <- runHub(ctx, runOptions{inventory: inv, journal: filepath.Join(dir, name+".db"), node: name, bind: "127.0.0.1:0",
				join: tb.Seeds(), keyFile: tb.GossipKeyFile(), identityFile: tb.HubIdentityFile(), pinnedFile: tb.PinnedKeysFile(), api: apiListen{socket: p.socket}, logLevel: "info", keep: 20}, p.logs, ready)
		}()
		select {
		case <-ready:
		case err := <-p.done:
			t.Fatalf("hub run %s: %v\n%s", name, err, p.logs)
		}
		t.Cleanup(func() {
			p.cancel()
			<-p.done
			if t.Failed() {
				t.Logf("%s logs:\n%s", name, p.logs)
			}
		})
		return p
	}
	status := func(p *proc) operator.Status {
		var out bytes.Buffer
		root := newRootCommand(&out, &out)
		root.SetArgs([]string{"status", "-o", "json", "--socket", p.socket})
		if err := root.ExecuteContext(context.Background()); err != nil {
			return operator.Status{}
		}
		var st operator.Status
		_ = json.Unmarshal(out.Bytes(), &st)
		return st
	}
	a := start("hub-a")
	require.Eventually(t, func() bool { st := status(a); return st.Budget != nil && st.NotPlanning == "" }, 30*time.Second, 100*time.Millisecond)
	b := start("hub-b")
	require.Eventually(t, func() bool { return strings.Contains(status(b).NotPlanning, "standing by: hub hub-a") }, 30*time.Second, 100*time.Millisecond)

	tb.Hang(2)
	require.Eventually(t, func() bool {
		st := status(a)
		return len(tb.Resets(2)) == 1 && st.Machines[2].Verdict == assess.VerdictHealthy && st.Machines[2].Remediation == nil
	}, 60*time.Second, 100*time.Millisecond)
	time.Sleep(time.Second)
	assert.Len(t, tb.Resets(2), 1, "one power action: the hub that stands by did nothing")
	assert.Contains(t, status(b).NotPlanning, "standing by")

	a.cancel()
	require.NoError(t, <-a.done)
	a.done <- nil
	require.Eventually(t, func() bool { st := status(b); return st.Budget != nil && st.NotPlanning == "" }, 30*time.Second, 100*time.Millisecond,
		"hub-b leads once hub-a is gone")
	require.Eventually(t, func() bool { return status(b).Machines[2].Verdict == assess.VerdictHealthy }, 30*time.Second, 100*time.Millisecond)
	time.Sleep(1100 * time.Millisecond) // past the cooldown
	tb.Hang(1)
	require.Eventually(t, func() bool { return len(tb.Resets(1)) == 1 }, 60*time.Second, 100*time.Millisecond, "hub-b heals")
}

// `hub run`'s bad flags are named before anything starts.
func TestRunRefusesBadFlags(t *testing.T) {
	base := runOptions{inventory: "inventory.yaml", keyFile: "gossip.key", logLevel: "info"}
	tests := []struct {
		name string
		edit func(*runOptions)
		want string
	}{
		{"no inventory", func(o *runOptions) { o.inventory = "" }, "--inventory and --gossip-key-file are required"},
		{"a log level", func(o *runOptions) { o.logLevel = "loud" }, `--log-level "loud": want debug, info, warn or error`},
		{"a negative verify timeout", func(o *runOptions) { o.bmcVerifyTimeout = -time.Second }, "--bmc-verify-timeout -1s: none may be negative"},
		{"a negative check interval", func(o *runOptions) { o.bmcCheckEvery = -time.Second }, "--bmc-check-interval -1s"},
		{"no identities", func(*runOptions) {}, "per-node identities are on by default: give this member's identity file and every member's pinned keys (docs/identities.md), " +
			"or turn them off with --insecure-no-identities: any holder of the gossip key can then speak for any member"},
		{"identities off, and files", func(o *runOptions) { o.noIdentities, o.pinnedFile = true, "pinned-keys" }, "--insecure-no-identities, and an identity or pinned-keys file"},
		{"enrolment off", func(o *runOptions) {
			o.kube = &kubeOptions{enrol: true}
			o.noIdentities = true
		}, "--enrol and --insecure-no-identities: enrolment is for identities"},
		{"enrolment without files", func(o *runOptions) { o.kube = &kubeOptions{enrol: true} }, "--enrol needs --identity-file"},
		{"management, discovering", func(o *runOptions) { o.kube = &kubeOptions{management: true, discover: true} },
			"--management finds each Cluster's machines itself: without --discover, --enrol, --degraded-journal or --capi-cluster"},
		{"management, with an inventory", func(o *runOptions) { o.kube = &kubeOptions{management: true} },
			"--management takes each Cluster's policy from its HealthPolicy and its gossip keys from its Secret: without --inventory or --gossip-key-file"},
		{"a gossip Service, not in management mode", func(o *runOptions) { o.kube = &kubeOptions{gossipService: "hale-hub-gossip"} },
			"--gossip-service is for --management"},
		{"management, a gossip Service without a pod address", func(o *runOptions) {
			o.inventory, o.keyFile, o.kube = "", "", &kubeOptions{management: true, gossipService: "hale-hub-gossip"}
		}, `--gossip-service hale-hub-gossip: this replica's pod address must be in the environment variable POD_IP (the downward API's status.podIP, as deploy/management sets it), not ""`},
		{"management, as a fallback", func(o *runOptions) { o.kube = &kubeOptions{management: true, fallback: true} },
			"--fallback is for a workload cluster's own hub; the management cluster's hub (--management) is the one it falls back from"},
		{"management, a pinned-keys file", func(o *runOptions) {
			o.inventory, o.keyFile, o.pinnedFile, o.kube = "", "", "pinned-keys", &kubeOptions{management: true, namespace: "hale-system"}
		}, "--management reads each workload cluster's pinned keys (ConfigMap hale-pinned-keys in its namespace hale-system) and pins its own key there: without --pinned-file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base
			tt.edit(&o)
			err := runHub(t.Context(), o, io.Discard, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	t.Run("a fallback outside Kubernetes mode", func(t *testing.T) {
		root := newRootCommand(io.Discard, io.Discard)
		root.SetArgs([]string{"run", "--fallback", "--inventory", "inventory.yaml"})
		err := root.ExecuteContext(t.Context())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "--fallback needs --kubernetes: the claim it shares with the management cluster's hub is a Lease in this cluster")
	})
}

// metricFamily returns the lines of a /metrics page for the metric that want names (its name up to a
// label set or a space), so that a failed expectation shows what the hub served instead.
func metricFamily(page, want string) string {
	name, _, _ := strings.Cut(want, "{")
	name, _, _ = strings.Cut(name, " ")
	var lines []string
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, name) {
			lines = append(lines, line)
		}
	}
	if len(lines) == 0 {
		return "(no " + name + ")"
	}
	return strings.Join(lines, "\n")
}
