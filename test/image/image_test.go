// Package image tests Hale's image as built (deploy/image/build-oci), not the binaries beside it: its
// definition against the Dockerfile's, and the programs run from inside it as the image's user.
//
// The image archive is HALE_IMAGE when set (test/run builds it once), else built here. It runs under
// podman when podman can run containers here; otherwise the unpacked root filesystem runs under chroot
// with the image's user (what a container runtime does, without namespaces), and the test says which.
package image

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/test/ipmisim"
)

// img is the image under test: its archive, its layout and root filesystem unpacked, and its config.
type img struct {
	archive, layout, rootfs string
	config                  ociConfig
	runner                  string // how it runs: podman (and its arguments) or chroot
	podmanID                string
	podmanArgs              []string // what podman run needs here
}

type ociConfig struct {
	Config struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

var image *img

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "hale-image-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if image, err = open(dir); err != nil {
			fmt.Fprintln(os.Stderr, "test/image:", err)
			return 1
		}
		if image.podmanID != "" {
			defer func() { _ = exec.Command("podman", "rmi", "-f", image.podmanID).Run() }()
		}
		return m.Run()
	}()
	os.Exit(code)
}

func repoRoot() string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		panic(err)
	}
	return strings.TrimSpace(string(out))
}

// open builds the image unless HALE_IMAGE names one, unpacks it and picks how to run it.
func open(dir string) (*img, error) {
	i := &img{archive: os.Getenv("HALE_IMAGE"), layout: filepath.Join(dir, "layout")}
	if i.archive == "" {
		i.archive = filepath.Join(dir, "hale.tar")
		cmd := exec.Command(filepath.Join(repoRoot(), "deploy", "image", "build-oci"), i.archive, "test")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("deploy/image/build-oci: %w\n%s", err, out)
		} else {
			fmt.Print(string(out))
		}
	}
	if err := os.MkdirAll(i.layout, 0o755); err != nil {
		return nil, err
	}
	if out, err := exec.Command("tar", "-xf", i.archive, "-C", i.layout).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("unpacking %s: %w\n%s", i.archive, err, out)
	}
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := readJSON(filepath.Join(i.layout, "index.json"), &index); err != nil || len(index.Manifests) != 1 {
		return nil, fmt.Errorf("%s: want one image in index.json (%v)", i.archive, err)
	}
	tag := index.Manifests[0].Annotations["org.opencontainers.image.ref.name"]
	var manifest struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
	}
	if err := readJSON(i.blob(index.Manifests[0].Digest), &manifest); err != nil {
		return nil, err
	}
	if err := readJSON(i.blob(manifest.Config.Digest), &i.config); err != nil {
		return nil, err
	}
	bundle := filepath.Join(dir, "bundle")
	if out, err := exec.Command("umoci", "unpack", "--image", i.layout+":"+tag, bundle).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("umoci unpack (Debian: apt-get install umoci; test/run installs it): %w\n%s", err, out)
	}
	i.rootfs = filepath.Join(bundle, "rootfs")
	i.runner = "chroot"
	out, err := exec.Command("podman", "load", "-q", "-i", i.archive).CombinedOutput()
	if err != nil {
		fmt.Printf("test/image: podman cannot load the image here (%v: %s); running it under chroot as its user\n", err, strings.TrimSpace(string(out)))
		return i, nil
	}
	id := strings.TrimSpace(string(out))
	id = id[strings.LastIndex(id, " ")+1:]
	// Plain podman first; in this sandbox crun refuses cgroup v1 in hybrid mode and no runtime may raise
	// a process limit, so runc with limits below the current ones is the second way.
	for _, args := range [][]string{nil, {"--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}} {
		run := append(append([]string{"run", "--rm", "--network", "host"}, args...), id, "--version")
		out, err := exec.Command("podman", run...).CombinedOutput()
		if err == nil {
			i.runner, i.podmanID, i.podmanArgs = "podman "+strings.Join(args, " "), id, args
			return i, nil
		}
		fmt.Printf("test/image: podman %s: %v: %s\n", strings.Join(run, " "), err, strings.TrimSpace(string(out)))
	}
	fmt.Println("test/image: podman cannot run the image here; running it under chroot as its user")
	return i, nil
}

func (i *img) blob(digest string) string {
	return filepath.Join(i.layout, "blobs", strings.Replace(digest, ":", "/", 1))
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// run runs argv inside the image as its user (argv[0] replaces the entrypoint), with files (host path
// → path in the image, given to the image's user) made available read-only, and returns the combined
// output.
func (i *img) run(t *testing.T, files map[string]string, argv ...string) (string, error) {
	t.Helper()
	uid, gid := i.ids(t)
	for host := range files { // as a Secret mounted for the pod's user
		require.NoError(t, os.Chown(host, uid, gid))
	}
	var cmd *exec.Cmd
	switch {
	case i.podmanID != "":
		args := append(append([]string{"run", "--rm", "--network", "host"}, i.podmanArgs...), "--entrypoint", argv[0])
		for host, in := range files {
			args = append(args, "-v", host+":"+in+":ro")
		}
		cmd = exec.Command("podman", append(append(args, i.podmanID), argv[1:]...)...)
	default:
		for host, in := range files {
			b, err := os.ReadFile(host)
			require.NoError(t, err)
			dst := filepath.Join(i.rootfs, in)
			require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
			require.NoError(t, os.WriteFile(dst, b, 0o600))
			require.NoError(t, os.Chown(dst, uid, gid))
			t.Cleanup(func() { os.Remove(dst) })
		}
		cmd = exec.Command("chroot", append([]string{"--userspec=" + i.config.Config.User, i.rootfs}, argv...)...)
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/"}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (i *img) ids(t *testing.T) (int, int) {
	var uid, gid int
	_, err := fmt.Sscanf(i.config.Config.User, "%d:%d", &uid, &gid)
	require.NoError(t, err, "the image's user %q", i.config.Config.User)
	return uid, gid
}

// One definition: the image's user, entrypoint and labels are the Dockerfile's, its packages are
// deploy/image/packages (which the Dockerfile installs), the binaries are where the manifests run them,
// and it is under 80 MiB compressed.
func TestImageIsWhatTheDockerfileSays(t *testing.T) {
	root := repoRoot()
	df, err := os.ReadFile(filepath.Join(root, "deploy", "image", "Dockerfile"))
	require.NoError(t, err)
	var user string
	var entrypoint []string
	labels := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(df)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "USER "):
			user = strings.TrimPrefix(line, "USER ")
		case strings.HasPrefix(line, "ENTRYPOINT "):
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "ENTRYPOINT ")), &entrypoint))
		case strings.HasPrefix(line, "LABEL "):
			k, v, _ := strings.Cut(strings.TrimPrefix(line, "LABEL "), "=")
			labels[k] = v
		}
	}
	assert.Contains(t, string(df), "COPY deploy/image/packages", "the Dockerfile installs deploy/image/packages")
	c := image.config.Config
	assert.Equal(t, user, c.User)
	assert.Equal(t, entrypoint, c.Entrypoint)
	for k, v := range labels {
		assert.Equal(t, v, c.Labels[k], "label %s", k)
	}
	assert.NotEmpty(t, labels)

	pkgs, err := os.ReadFile(filepath.Join(root, "deploy", "image", "packages"))
	require.NoError(t, err)
	status, err := os.ReadFile(filepath.Join(image.rootfs, "var", "lib", "dpkg", "status"))
	require.NoError(t, err)
	for _, p := range strings.Fields(string(pkgs)) {
		assert.Contains(t, string(status), "Package: "+p+"\nStatus: install ok installed", p)
	}
	for _, b := range []string{"hub", "agent"} {
		st, err := os.Stat(filepath.Join(image.rootfs, "usr", "local", "bin", b))
		require.NoError(t, err, b)
		assert.NotZero(t, st.Mode()&0o001, "%s is executable by anyone (the image's user is not its owner)", b)
	}
	var compressed int64
	blobs, err := filepath.Glob(filepath.Join(image.layout, "blobs", "sha256", "*"))
	require.NoError(t, err)
	for _, b := range blobs {
		st, err := os.Stat(b)
		require.NoError(t, err)
		compressed += st.Size()
	}
	fmt.Printf("image: %.1f MiB compressed, run under %s\n", float64(compressed)/(1<<20), image.runner)
	assert.Less(t, compressed, int64(80<<20), "under 80 MiB compressed")
}

// The programs run from inside the image, as its (non-root) user.
func TestImageRuns(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"/usr/local/bin/hub", "version"}, "(commit "},
		{[]string{"/usr/local/bin/agent", "version"}, "(commit "},
		{[]string{"ipmitool", "-V"}, "ipmitool version"},
		{[]string{"id", "-u"}, strings.Split(image.config.Config.User, ":")[0]},
	} {
		out, err := image.run(t, nil, tc.argv...)
		require.NoError(t, err, "%v: %s", tc.argv, out)
		assert.Contains(t, out, tc.want, tc.argv)
		t.Logf("%s: %s", strings.Join(tc.argv, " "), strings.TrimSpace(out))
	}
	uid, _ := image.ids(t)
	assert.NotZero(t, uid, "the image's user is not root (the hub's Deployment runs it as 65532; the agent's DaemonSet as root)")
}

// One real `hub bmc power status` from inside the image against each kind of BMC: ipmi_sim (through
// the image's ipmitool) and the Redfish simulator.
func TestImageBMCPowerStatus(t *testing.T) {
	dir := t.TempDir()
	sim := ipmisim.Start(t)
	ipmiCreds := filepath.Join(dir, "ipmi")
	require.NoError(t, os.WriteFile(ipmiCreds, []byte(fmt.Sprintf("username=%s\npassword=%s\n", sim.Username, sim.Password)), 0o600))
	out, err := image.run(t, map[string]string{ipmiCreds: "/tmp/creds/ipmi"}, "/usr/local/bin/hub", "bmc", "power", "status",
		sim.Endpoint(), "--credentials", "/tmp/creds/ipmi")
	require.NoError(t, err, out)
	assert.True(t, strings.HasSuffix(strings.TrimSpace(out), ": On"), out)
	t.Logf("IPMI (ipmi_sim %s): %s", sim.Endpoint(), strings.TrimSpace(out))

	rf, err := bmcsim.Start(bmcsim.Config{Username: "admin", Password: "image-secret", PlainHTTP: true,
		Systems: []bmcsim.SystemConfig{{ID: "cp-0", PowerOnDelay: 100 * time.Millisecond}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rf.Close() })
	rfCreds := filepath.Join(dir, "redfish")
	require.NoError(t, os.WriteFile(rfCreds, []byte("username=admin\npassword=image-secret\n"), 0o600))
	out, err = image.run(t, map[string]string{rfCreds: "/tmp/creds/redfish"}, "/usr/local/bin/hub", "bmc", "power", "status",
		rf.Endpoint()+"/systems/cp-0", "--credentials", "/tmp/creds/redfish")
	require.NoError(t, err, out)
	assert.True(t, strings.HasSuffix(strings.TrimSpace(out), ": On"), out)
	t.Logf("Redfish (bmcsim %s): %s", rf.Endpoint(), strings.TrimSpace(out))
}
