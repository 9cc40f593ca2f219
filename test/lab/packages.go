package lab

import (
	"os"
	"os/exec"
	"path/filepath"

	"github.com/hale-dev/hale/test/netns"
)

// Packages are the Debian packages a test installs and the static binaries they hold: the release's
// (HALE_RELEASE_DIR, as test/run cuts it: its packages, and its linux/amd64 binaries unpacked) or,
// without one, both built here from the working tree (deploy/image/build-binaries, deploy/deb/build,
// version v0.0.1).
type Packages struct {
	Agent, Hub string // the .deb files
	Bin        string // hub and agent
}

// DebianPackages finds or builds them (amd64).
func DebianPackages(t netns.TB) Packages {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatalf("packages: %v", err)
	}
	work := t.TempDir()
	p := Packages{Bin: filepath.Join(work, "bin")}
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("packages: %v: %v\n%s", args, err, out)
		}
	}
	dir := os.Getenv("HALE_RELEASE_DIR")
	if dir == "" {
		dir = filepath.Join(work, "release")
		run("deploy/image/build-binaries", p.Bin, "hub", "agent")
		run("deploy/deb/build", "v0.0.1", "amd64", p.Bin, dir)
	} else {
		if err := os.MkdirAll(p.Bin, 0o755); err != nil {
			t.Fatalf("packages: %v", err)
		}
		run("tar", "-xzf", one(t, dir, "hale_v*_linux_amd64.tar.gz"), "-C", p.Bin, "--strip-components=1")
	}
	p.Agent, p.Hub = one(t, dir, "hale-agent_*_amd64.deb"), one(t, dir, "hale-hub_*_amd64.deb")
	return p
}

// Build makes the packages of another version from the same binaries (an upgrade's), in dir.
func (p Packages) Build(t netns.TB, version, dir string) Packages {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatalf("packages: %v", err)
	}
	cmd := exec.Command(filepath.Join(root, "deploy", "deb", "build"), version, "amd64", p.Bin, dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("packages: deploy/deb/build %s: %v\n%s", version, err, out)
	}
	return Packages{Agent: one(t, dir, "hale-agent_*_amd64.deb"), Hub: one(t, dir, "hale-hub_*_amd64.deb"), Bin: p.Bin}
}

// one is the one file of dir that pattern matches.
func one(t netns.TB, dir, pattern string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil || len(m) != 1 {
		t.Fatalf("packages: want one %s in %s, found %v (%v)", pattern, dir, m, err)
	}
	return m[0]
}
