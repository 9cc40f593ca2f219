package kubeenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// The user's own overlay, as docs/install.md ("Your own overlay") shows it: a kustomization.yaml of
// the user's on a release's overlay and components fetched by their tag from Hale's repository.
// Tests build it on a local git repository holding the checkout's deploy/ under that tag, the doc's
// https://github.com/hale-dev/hale becoming its file:// URL (kustomize clones either the same way).

// docRepo is the repository the doc's URLs name.
const docRepo = "https://github.com/hale-dev/hale"

// DeployRepo makes a git repository in dir holding a copy of the checkout's deploy/, committed and
// tagged tag, and returns its path.
func DeployRepo(dir, tag string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	repo := filepath.Join(dir, "hale")
	if err := os.MkdirAll(repo, 0o755); err != nil {
		return "", err
	}
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "deploy"), repo).CombinedOutput(); err != nil {
		return "", fmt.Errorf("copying deploy/: %w: %s", err, out)
	}
	if err := git(repo, "init", "--quiet"); err != nil {
		return "", err
	}
	return repo, TagRelease(repo, tag, nil)
}

// TagRelease commits what change does to repo's deploy/ (nothing when nil) and tags it tag.
func TagRelease(repo, tag string, change func(deploy string) error) error {
	if change != nil {
		if err := change(filepath.Join(repo, "deploy")); err != nil {
			return err
		}
	}
	for _, args := range [][]string{{"add", "-A"}, {"commit", "--quiet", "--allow-empty", "-m", tag}, {"tag", tag}} {
		if err := git(repo, args...); err != nil {
			return err
		}
	}
	return nil
}

func git(dir string, args ...string) error {
	cmd := exec.Command("git", append([]string{"-c", "user.name=test", "-c", "user.email=test@hale.invalid", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("git %s in %s: %w: %s", strings.Join(args, " "), dir, err, out)
	}
	return nil
}

// OwnOverlay is the kustomization.yaml install.md's "Your own overlay" gives, its URLs on repo (a
// DeployRepo) instead of GitHub, without the lines that name a component in drop (as the doc allows).
func OwnOverlay(repo string, drop ...string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "install.md"))
	if err != nil {
		return "", err
	}
	_, section, ok := strings.Cut(string(b), "\n### Your own overlay\n")
	_, block, ok2 := strings.Cut(section, "\n```yaml\n")
	block, _, ok3 := strings.Cut(block, "\n```\n")
	if !ok || !ok2 || !ok3 {
		return "", fmt.Errorf("docs/install.md: no yaml block under \"### Your own overlay\"")
	}
	var kept []string
	for line := range strings.SplitSeq(block, "\n") {
		if dropped(line, drop) {
			continue
		}
		kept = append(kept, line)
	}
	out := strings.ReplaceAll(strings.Join(kept, "\n")+"\n", docRepo+"//", "file://"+repo+"//")
	if strings.Contains(out, "github.com") {
		return "", fmt.Errorf("docs/install.md's overlay names a URL other than %s//…: %s", docRepo, out)
	}
	var k map[string]any
	if err := yaml.Unmarshal([]byte(out), &k); err != nil {
		return "", fmt.Errorf("docs/install.md's overlay: %w", err)
	}
	return out, nil
}

// dropped says whether line names one of the components in drop.
func dropped(line string, drop []string) bool {
	for _, d := range drop {
		if strings.Contains(line, "/deploy/components/"+d+"?") {
			return true
		}
	}
	return false
}

// prometheusOperator ships the CRDs of the objects Hale's monitoring components make.
const prometheusOperator = "github.com/prometheus-operator/prometheus-operator@v0.94.1"

// InstallMonitoringCRDs installs the Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, as
// its repository ships them, into the API server at cfg: what deploy/components/servicemonitor and
// alerts make is then checked against their schemas.
func InstallMonitoringCRDs(cfg *rest.Config) error {
	dir, err := moduleDir(prometheusOperator, "")
	if err != nil {
		return err
	}
	crds := filepath.Join(dir, "example", "prometheus-operator-crd")
	_, err = envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{ErrorIfPathMissing: true, Paths: []string{
		filepath.Join(crds, "monitoring.coreos.com_servicemonitors.yaml"), filepath.Join(crds, "monitoring.coreos.com_prometheusrules.yaml")}})
	return err
}

// DocShellBlocks are the sh blocks of docs/doc's section under heading (a whole line, such as
// "## In a management cluster"), up to the next section of level 2, in order: what a test types.
func DocShellBlocks(doc, heading string) ([]string, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", doc))
	if err != nil {
		return nil, err
	}
	_, section, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		return nil, fmt.Errorf("docs/%s has no section %q", doc, heading)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var blocks []string
	for _, m := range shellBlock.FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks, nil
}

var shellBlock = regexp.MustCompile("(?s)```sh\n(.*?)```")
