package kubeadm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/test/lab"
)

// standalonePath takes Hale off Kubernetes as docs/uninstall.md says, then installs it on the same
// machines from the release's Debian packages as install.md's standalone section says, typing its
// lines (each checked against the doc): the agents on the three control-plane nodes, the hub on a
// worker, the BMCs the lab's. Then a control-plane node hangs and the standalone hub heals it through
// its BMC, after its stall tolerance. It prints how long the install took and how many lines were typed.
func standalonePath(ctx context.Context, t *testing.T, c *lab.KubeCluster) {
	t.Helper()
	// Off Kubernetes: the overlay deleted (its namespace with it), nothing labelled Hale's left, the
	// identity enrolments deleted.
	removed := time.Now()
	c.Documented("uninstall.md", "kubectl delete --ignore-not-found -k .                # or, in your own overlay's directory, the overlay")
	if out, err := c.Shell(ctx, c.Overlay, "kubectl delete --ignore-not-found -k . --wait=true"); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	check := "kubectl get all,cm,secret,sa,role,rolebinding,clusterrole,clusterrolebinding -A -l app.kubernetes.io/part-of=hale"
	c.Documented("uninstall.md", "`"+check+"`")
	left, err := c.Shell(ctx, "", check)
	require.NoError(t, err, left)
	require.Contains(t, left, "No resources found", "uninstall.md's check lists what is left")
	csrs := "kubectl get csr --field-selector spec.signerName=hale.dev/identity"
	c.Documented("uninstall.md", "`"+csrs+"`")
	names, err := c.Kubectl(ctx, "get", "csr", "--field-selector", "spec.signerName=hale.dev/identity", "-o", "name")
	require.NoError(t, err, names)
	require.NotEmpty(t, strings.Fields(names), "the agents' enrolments")
	out, err := c.Kubectl(ctx, append([]string{"delete"}, strings.Fields(names)...)...)
	require.NoError(t, err, out)
	t.Logf("standalone: Hale off Kubernetes in %s", time.Since(removed).Round(time.Second))

	// On hosts, from the packages.
	start := time.Now()
	typed := 0
	doc := func(text string) { t.Helper(); c.Documented("install.md", text) }
	sh := func(n *lab.Node, line string) string {
		t.Helper()
		typed++
		out, err := n.Exec(ctx, "sh", "-ec", line)
		require.NoError(t, err, "%s on %s: %s", line, n.Name, out)
		return out
	}
	cps := c.ControlPlanes()
	var hubHost *lab.Node
	for _, n := range c.Nodes {
		if !n.ControlPlane {
			hubHost = n
			break
		}
	}
	require.NotNil(t, hubHost, "a worker for the hub")
	pkgs := lab.DebianPackages(t)
	put := func(n *lab.Node, path string, body []byte, mode os.FileMode) {
		t.Helper()
		require.NoError(t, os.WriteFile(n.DiskPath(path), body, mode))
		require.NoError(t, os.Chmod(n.DiskPath(path), mode))
	}
	// 1. Packages.
	doc("`apt-get install ./hale-agent_DEBVERSION_ARCH.deb`")
	doc("`apt-get install ./hale-hub_DEBVERSION_ARCH.deb`")
	install := func(n *lab.Node, deb string) {
		b, err := os.ReadFile(deb)
		require.NoError(t, err)
		put(n, "/root/"+filepath.Base(deb), b, 0o644)
		sh(n, "cd /root && apt-get install -y ./"+filepath.Base(deb))
	}
	for _, n := range cps {
		install(n, pkgs.Agent)
	}
	install(hubHost, pkgs.Hub)
	// 2. The gossip key, made on one host and copied to the others with its mode.
	gossip := "install -m 0600 /dev/null /etc/hale/gossip.key && head -c 32 /dev/urandom | base64 > /etc/hale/gossip.key"
	doc("`" + gossip + "`")
	sh(cps[0], gossip)
	key, err := cps[0].ReadFile("/etc/hale/gossip.key")
	require.NoError(t, err)
	for _, n := range append(cps[1:], hubHost) {
		typed++ // scp
		put(n, "/etc/hale/gossip.key", key, 0o600)
	}
	// 3. Identities, collected into the pinned keys on every host.
	doc("`agent --node NODE --identity-file /var/lib/hale/identity.key --print-identity`")
	hubIdentity := "runuser -u hale -- hub identity --identity-file /var/lib/hale-hub/identity.key"
	doc("`" + hubIdentity + "`")
	var pinned strings.Builder
	for _, n := range cps {
		pinned.WriteString(strings.TrimSpace(sh(n, "agent --node "+n.Name+" --identity-file /var/lib/hale/identity.key --print-identity")) + "\n")
	}
	pinned.WriteString(strings.TrimSpace(sh(hubHost, hubIdentity)) + "\n")
	for _, n := range append(cps, hubHost) {
		typed++
		put(n, "/etc/hale/pinned-keys", []byte(pinned.String()), 0o644)
	}
	// 4. The agents.
	var joins []string
	for _, n := range cps {
		joins = append(joins, n.Host.Addr(7946))
	}
	agentYAML := fmt.Sprintf("cluster: prod-eu1\ngossip:\n  keyFile: /etc/hale/gossip.key\n  identityFile: /var/lib/hale/identity.key\n"+
		"  pinnedFile: /etc/hale/pinned-keys\n  join: [%s]\n", strings.Join(joins, ", "))
	doc("`/usr/share/hale/agent.yaml.example`")
	doc("`systemctl start hale-agent`")
	for _, n := range cps {
		typed++
		put(n, "/etc/hale/agent.yaml", []byte(agentYAML), 0o644)
		sh(n, "systemctl start hale-agent")
	}
	// 5. The hub: the inventory (the lab's BMCs), their login, hub check, the agents to join, started.
	var inv strings.Builder
	inv.WriteString("cluster: prod-eu1\nclasses:\n  control-plane: {strategy: reboot}\nmachines:\n")
	for _, n := range cps {
		fmt.Fprintf(&inv, "  - {name: %s, member: %s, class: control-plane, bmc: {endpoint: %q, credentials: bmc-credentials}}\n", n.Name, n.Name, n.BMC)
	}
	typed++
	put(hubHost, "/etc/hale/inventory.yaml", []byte(inv.String()), 0o644)
	creds := `install -m 0600 -o hale -g hale /dev/null /etc/hale/bmc-credentials && printf 'username=%s\npassword=%s\n' hale 'the password' > /etc/hale/bmc-credentials`
	doc("`" + creds + "`")
	sh(hubHost, strings.Replace(creds, " hale 'the password'", " admin 'lab-secret'", 1))
	doc("`hub check --inventory /etc/hale/inventory.yaml`")
	checked := sh(hubHost, "hub check --inventory /etc/hale/inventory.yaml")
	require.Contains(t, checked, "valid, 3 machines", checked)
	doc("`/etc/hale/hub.env` (`HALE_JOIN=10.0.0.11:7946,10.0.0.12:7946,10.0.0.13:7946`")
	sh(hubHost, "sed -i 's/^HALE_JOIN=.*/HALE_JOIN="+strings.Join(joins, ",")+"/' /etc/hale/hub.env")
	doc("`systemctl start hale-hub`")
	sh(hubHost, "systemctl start hale-hub")
	standaloneStatus(ctx, t, hubHost, "every machine Healthy, from the packages", standaloneHealthy)
	// Running on, not restarted by systemd: a unit that exits at start is active for moments between
	// its restarts, and a status read in one of them looks whole.
	for _, n := range append(slices.Clone(cps), hubHost) {
		unit := "hale-agent"
		if n == hubHost {
			unit = "hale-hub"
		}
		out, err := n.Exec(ctx, "systemctl", "show", "-p", "NRestarts", unit)
		require.NoError(t, err, out)
		require.Equal(t, "NRestarts=0", strings.TrimSpace(out), "%s on %s runs on, not restarted by systemd", unit, n.Name)
	}
	t.Logf("standalone: installed from the Debian packages on 3 control-plane nodes and a hub host, every machine Healthy %s after the first apt-get install, %d lines typed",
		time.Since(start).Round(time.Second), typed)

	// A hung node, healed by the standalone hub through its BMC once its stall tolerance has passed.
	n := c.Node("cp-1")
	before := len(c.PowerEvents())
	hung := time.Now()
	n.Freeze()
	standaloneStatus(ctx, t, hubHost, n.Name+" power-cycled and every machine Healthy", func(st operator.Status) bool {
		return standaloneHealthy(st) && len(powerChanges(c, before)) >= 2
	})
	powered := powerChanges(c, before)
	require.Len(t, powered, 2, "one power-cycle of the hung node, nothing else: %v", powered)
	for i, kind := range []string{"power-off ", "power-on "} {
		require.True(t, strings.HasPrefix(powered[i], kind+n.Name+" "+bmcOf(c, n)), "one power-cycle of the hung node by its BMC: %v", powered)
	}
	off := time.Duration(0)
	for i, e := range c.PowerEvents()[before:] {
		if strings.HasPrefix(e, "power-off ") {
			off = c.PowerEventAt(before + i).Sub(hung)
			break
		}
	}
	require.GreaterOrEqual(t, off, pass.DefaultStallTolerance-time.Second, "power-cycled before its stall tolerance")
	t.Logf("standalone: %s hung: powered off by the standalone hub through %s after %s, every machine Healthy after %s",
		n.Name, bmcOf(c, n), off.Round(100*time.Millisecond), time.Since(hung).Round(time.Second))
}

// standaloneStatus waits until the standalone hub's status (`hub status -o json` on its host)
// satisfies ok.
func standaloneStatus(ctx context.Context, t *testing.T, host *lab.Node, what string, ok func(operator.Status) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	var last string
	for {
		out, err := host.Exec(ctx, "hub", "status", "-o", "json")
		var st operator.Status
		if err == nil && json.Unmarshal([]byte(out), &st) == nil && ok(st) {
			return
		}
		last = out
		if time.Now().After(deadline) {
			logs, _ := host.Exec(ctx, "journalctl", "--no-pager", "-n", "80", "-u", "hale-hub")
			t.Fatalf("standalone: waiting for %s: %s\n%s", what, last, logs)
		}
		time.Sleep(time.Second)
	}
}

// standaloneHealthy: the three machines Healthy, the hub hearing itself and the three agents.
func standaloneHealthy(st operator.Status) bool { return healthyHearing(st, 4) }
