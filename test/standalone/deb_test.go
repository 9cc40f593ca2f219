// Package standalone checks Hale installed on hosts, as docs/install.md's standalone section says: the
// Debian packages on a systemd machine (test/lab's node root filesystem: Debian bookworm with systemd).
package standalone

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/lab"
	"github.com/hale-dev/hale/test/netns"
)

var assets string

func TestMain(m *testing.M) {
	if why := lab.KubeAvailable(); why != "" {
		fmt.Fprintf(os.Stderr, "test/standalone: %s: these tests need root and podman\n", why)
		os.Exit(1)
	}
	var err error
	if assets, err = lab.KubeAssets(); err != nil {
		fmt.Fprintf(os.Stderr, "test/standalone: %v\n", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// machine is a systemd machine booted from the node root filesystem, under an overlay of its own.
type machine struct {
	t         *testing.T
	name, dir string
}

// boot starts a machine with systemd as its init, on a host of a network-namespace lab of the test's
// own, and the units of the node image that would start a kubelet and import images masked.
func boot(t *testing.T, name string) *machine {
	host := netns.New(t).Host(name)
	m := &machine{t: t, name: fmt.Sprintf("hale-standalone-%s-%d", name, os.Getpid()), dir: t.TempDir()}
	for _, d := range []string{"upper", "work", "root"} {
		require.NoError(t, os.MkdirAll(filepath.Join(m.dir, d), 0o755))
	}
	root := filepath.Join(m.dir, "root")
	run(t, "mount", "-t", "overlay", "overlay", "-o", fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s",
		filepath.Join(assets, "rootfs"), filepath.Join(m.dir, "upper"), filepath.Join(m.dir, "work")), root)
	t.Cleanup(func() { _ = exec.Command("umount", "-l", root).Run() })
	for _, unit := range []string{"kubelet.service", "containerd.service", "node-images.service"} {
		p := filepath.Join(root, "etc/systemd/system", unit)
		_ = os.Remove(p)
		require.NoError(t, os.Symlink("/dev/null", p))
	}
	_ = exec.Command("podman", "rm", "-f", m.name).Run()
	// As test/lab's nodes: runc (crun refuses this machine's hybrid cgroup v1), limits within this
	// machine's own.
	run(t, "podman", "run", "-d", "--name", m.name, "--hostname", name, "--runtime", "runc", "--privileged", "--cgroupns", "private",
		"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--network", "ns:/run/netns/"+host.NS, "--systemd", "always", "--tmpfs", "/run", "--tmpfs", "/tmp", "--rootfs", root, "/sbin/init")
	t.Cleanup(func() { _ = exec.Command("podman", "rm", "-f", "-t", "0", m.name).Run() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ := m.exec("systemctl", "is-system-running")
		if s := strings.TrimSpace(out); s == "running" || s == "degraded" {
			break
		}
		require.True(t, time.Now().Before(deadline), "%s: systemd not up after 60 s: %s", name, out)
		time.Sleep(300 * time.Millisecond)
	}
	return m
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	require.NoError(t, err, "%s: %s", strings.Join(args, " "), out)
	return string(out)
}

func (m *machine) exec(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "podman", append([]string{"exec", m.name}, args...)...).CombinedOutput()
	return string(out), err
}

// sh runs a shell line on the machine, as an operator types it, and fails the test when it fails.
func (m *machine) sh(line string) string {
	m.t.Helper()
	out, err := m.exec("sh", "-ec", line)
	require.NoError(m.t, err, "%s: %s", line, out)
	return out
}

// copyIn puts a file of this machine at path on the machine's disk.
func (m *machine) copyIn(src, path string) {
	m.t.Helper()
	run(m.t, "podman", "cp", src, m.name+":"+path)
}

// kubeadmPKI puts a CA and a client certificate signed by it where kubeadm puts etcd's
// (/etc/kubernetes/pki/etcd: ca.crt, healthcheck-client.crt and .key), and the same CA where kubeadm
// puts the cluster's (/etc/kubernetes/pki/ca.crt, which the agent's API server probe checks with).
func (m *machine) kubeadmPKI() {
	m.t.Helper()
	dir := m.t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(m.t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd-ca"}, NotBefore: time.Now().Add(-time.Minute),
		NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(m.t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(m.t, err)
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	m.sh("mkdir -p /etc/kubernetes/pki/etcd")
	for name, data := range map[string][]byte{"ca.crt": cert, "healthcheck-client.crt": cert,
		"healthcheck-client.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})} {
		require.NoError(m.t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
		m.copyIn(filepath.Join(dir, name), "/etc/kubernetes/pki/etcd/"+name)
	}
	m.copyIn(filepath.Join(dir, "ca.crt"), "/etc/kubernetes/pki/ca.crt")
}

// stat is a path's owner, group and mode ("root root 700"), "" when it does not exist.
func (m *machine) stat(path string) string {
	out, err := m.exec("stat", "-c", "%U %G %a", path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

// TestDebianPackages installs hale-agent and hale-hub on a systemd machine, configures them (on one
// host, the shared case: the hub's user must read the gossip key the agent, root, reads too), starts
// both units, upgrades them, removes and purges them, and checks what each step leaves, as Debian's
// rules and docs/uninstall.md say.
func TestDebianPackages(t *testing.T) {
	pkgs := lab.DebianPackages(t)
	next := pkgs.Build(t, "v99.0.0-rc.1", t.TempDir())
	agentDeb, hubDeb, nextAgent, nextHub := pkgs.Agent, pkgs.Hub, next.Agent, next.Hub
	start := time.Now()
	m := boot(t, "host")
	for _, p := range []string{agentDeb, hubDeb, nextAgent, nextHub} {
		m.copyIn(p, "/root/")
	}

	// Installed: binaries, units enabled but not started (not configured yet: the condition), the
	// hub's system user and state directory, the agent's.
	documented(t, "`apt-get install ./hale-agent_DEBVERSION_ARCH.deb` on each control-plane node, `apt-get install ./hale-hub_DEBVERSION_ARCH.deb` on the hub's host")
	m.sh("cd /root && apt-get install -y ./" + filepath.Base(agentDeb) + " ./" + filepath.Base(hubDeb))
	assert.Contains(t, m.sh("agent version; hub version"), "agent")
	for _, unit := range []string{"hale-agent", "hale-hub"} {
		assert.Equal(t, "enabled", strings.TrimSpace(m.sh("systemctl is-enabled "+unit)), unit)
		out, _ := m.exec("systemctl", "show", "-p", "ActiveState,ConditionResult", unit)
		assert.Contains(t, out, "ConditionResult=no", "%s before its configuration: %s", unit, out)
		assert.Contains(t, out, "ActiveState=inactive", "%s before its configuration (not failed): %s", unit, out)
	}
	assert.Regexp(t, regexp.MustCompile(`^hale:x:\d+:\d+:Hale hub:/var/lib/hale-hub:/usr/sbin/nologin$`), strings.TrimSpace(m.sh("getent passwd hale")))
	assert.Equal(t, "hale hale 700", m.stat("/var/lib/hale-hub"))
	assert.Equal(t, "root root 700", m.stat("/var/lib/hale"))
	assert.Equal(t, "root root 644", m.stat("/etc/hale/hub.env"))
	for _, example := range []string{"/usr/share/hale/agent.yaml.example", "/usr/share/hale/inventory.yaml.example"} {
		documented(t, "`"+example+"`")
		assert.Equal(t, "root root 644", m.stat(example), "%s (this image, as minimal ones, leaves /usr/share/doc out)", example)
	}

	// Configured as the standalone section says, on one host: the gossip key root's alone (the hub's
	// unit has systemd hand it a copy); identities; the pinned keys; the inventory.
	gossip := "install -m 0600 /dev/null /etc/hale/gossip.key && head -c 32 /dev/urandom | base64 > /etc/hale/gossip.key"
	documented(t, "`"+gossip+"`")
	m.sh(gossip)
	documented(t, "`agent --node NODE --identity-file /var/lib/hale/identity.key --print-identity`")
	agentLine := m.sh("agent --node host --identity-file /var/lib/hale/identity.key --print-identity")
	hubIdentity := "runuser -u hale -- hub identity --identity-file /var/lib/hale-hub/identity.key"
	documented(t, "`"+hubIdentity+"`")
	hubLine := m.sh(hubIdentity)
	m.sh(fmt.Sprintf("printf '%%s\\n%%s\\n' %q %q > /etc/hale/pinned-keys", strings.TrimSpace(agentLine), strings.TrimSpace(hubLine)))
	// A control-plane node has kubeadm's etcd client certificate, which the agent reads etcd with, and
	// the cluster's CA, which it checks the API server with (nothing answers here: those probes fail,
	// and the agent runs on). Without either the agent exits at start and systemd restarts it every
	// 2 s: "active" only by luck of the moment (the API server's CA was missing, and the test passed
	// on that luck until a run's upgrade check polled 30 s of restarts). Each unit's restarts are
	// counted below.
	m.kubeadmPKI()
	m.sh(`cat > /etc/hale/agent.yaml <<'EOF'
cluster: prod-eu1
node: host
gossip:
  keyFile: /etc/hale/gossip.key
  identityFile: /var/lib/hale/identity.key
  pinnedFile: /etc/hale/pinned-keys
  join: [127.0.0.1:7947]
EOF`)
	m.sh(`cat > /etc/hale/inventory.yaml <<'EOF'
cluster: prod-eu1
classes:
  control-plane: {strategy: reboot}
machines:
  - {name: host, member: etcd-host, class: control-plane, bmc: {endpoint: "redfish://127.0.0.1:1", credentials: bmc-credentials}}
EOF
sed -i 's/^HALE_JOIN=.*/HALE_JOIN=127.0.0.1:7946/' /etc/hale/hub.env`)
	creds := `install -m 0600 -o hale -g hale /dev/null /etc/hale/bmc-credentials && printf 'username=%s\npassword=%s\n' hale 'the password' > /etc/hale/bmc-credentials`
	documented(t, "`"+creds+"`")
	m.sh(creds)
	// hub check: the inventory valid, the BMC (nothing answers at it) not ready: exit 2, the BMC named,
	// the password nowhere.
	documented(t, "`hub check --inventory /etc/hale/inventory.yaml` (exit 0: all ready; 1: the inventory is wrong; 2: a BMC is not ready)")
	out, err := m.exec("hub", "check", "--inventory", "/etc/hale/inventory.yaml")
	require.Error(t, err, "hub check of a BMC nothing answers at: %s", out)
	assert.Equal(t, 2, err.(*exec.ExitError).ExitCode(), "hub check: %s", out)
	assert.Contains(t, out, "redfish://127.0.0.1:1", "hub check names the BMC")
	assert.NotContains(t, out, "the password")
	documented(t, "`systemctl start hale-agent`")
	documented(t, "`systemctl start hale-hub`")
	m.sh("systemctl start hale-agent")
	m.sh("systemctl start hale-hub")
	waitFor(t, m, "hub status sees the agent", func() (bool, string) {
		out, err := m.exec("hub", "status")
		return err == nil && strings.Contains(out, "host"), out
	})
	waitFor(t, m, "the agent's readiness", func() (bool, string) {
		out, err := m.exec("sh", "-c", "systemctl is-active hale-agent && systemctl is-active hale-hub")
		return err == nil, out
	})
	time.Sleep(3 * time.Second) // longer than systemd's 2 s between restarts
	for _, unit := range []string{"hale-agent", "hale-hub"} {
		assert.Equal(t, "NRestarts=0", strings.TrimSpace(m.sh("systemctl show -p NRestarts "+unit)), "%s runs on, not restarted by systemd", unit)
	}
	journal := m.stat("/var/lib/hale-hub/journal.db")
	require.Equal(t, "hale hale 600", journal, "the hub's journal")

	// Upgraded: the configuration (a changed conffile too) and the journal kept, the units restarted.
	m.sh("cd /root && apt-get install -y ./" + filepath.Base(nextAgent) + " ./" + filepath.Base(nextHub))
	assert.Contains(t, m.sh("dpkg-query -W -f '${Version}' hale-hub"), "99.0.0~rc.1")
	assert.Contains(t, m.sh("cat /etc/hale/hub.env"), "HALE_JOIN=127.0.0.1:7946")
	assert.Equal(t, journal, m.stat("/var/lib/hale-hub/journal.db"))
	waitFor(t, m, "both units active after the upgrade", func() (bool, string) {
		out, err := m.exec("sh", "-c", "systemctl is-active hale-agent && systemctl is-active hale-hub")
		return err == nil, out
	})

	// Removed: stopped, the binaries and units gone, configuration and state kept ("rc").
	m.sh("apt-get remove -y hale-agent hale-hub")
	for _, unit := range []string{"hale-agent", "hale-hub"} {
		out, _ := m.exec("systemctl", "is-active", unit)
		assert.NotEqual(t, "active", strings.TrimSpace(out), "%s after apt-get remove", unit)
	}
	assert.Empty(t, m.stat("/usr/bin/hub"))
	assert.Empty(t, m.stat("/usr/lib/systemd/system/hale-hub.service"))
	assert.NotEmpty(t, m.stat("/etc/hale/hub.env"), "a conffile after remove")
	assert.NotEmpty(t, m.stat("/var/lib/hale-hub/journal.db"), "the journal after remove")
	assert.NotEmpty(t, m.stat("/var/lib/hale/identity.key"), "the agent's identity after remove")
	assert.Contains(t, m.sh("dpkg -l hale-hub hale-agent"), "rc  hale-hub")

	// Purged: the state and the conffile gone; what the admin made in /etc/hale is theirs
	// (docs/uninstall.md removes it), and the system user stays (Debian's rule).
	m.sh("apt-get purge -y hale-agent hale-hub")
	assert.Empty(t, m.stat("/etc/hale/hub.env"))
	assert.Empty(t, m.stat("/var/lib/hale-hub"))
	assert.Empty(t, m.stat("/var/lib/hale"))
	assert.NotEmpty(t, m.stat("/etc/hale/inventory.yaml"))
	out, _ = m.exec("dpkg-query", "-W", "hale-hub")
	assert.Contains(t, out, "no packages found matching hale-hub")
	m.sh("getent passwd hale")
	t.Logf("debian packages: a machine booted, both installed, configured, started, upgraded, removed and purged in %v", time.Since(start).Round(time.Second))
}

// documented fails the test when docs/install.md no longer says text (its line breaks as spaces):
// what the test types as an operator is what the doc tells one to type.
func documented(t *testing.T, text string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/install.md")
	require.NoError(t, err)
	flat := strings.Join(strings.Fields(string(b)), " ")
	require.Contains(t, flat, strings.Join(strings.Fields(text), " "), "docs/install.md no longer says it")
}

func waitFor(t *testing.T, m *machine, what string, ok func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		done, last := ok()
		if done {
			return
		}
		if time.Now().After(deadline) {
			logs, _ := m.exec("journalctl", "--no-pager", "-n", "60", "-u", "hale-hub", "-u", "hale-agent")
			t.Fatalf("%s: not within 30 s; last: %s\n%s", what, last, logs)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
