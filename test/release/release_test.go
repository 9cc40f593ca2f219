// Package release checks a release cut by deploy/release as a user receives it: every file in
// SHA256SUMS and each checksum right, static binaries of the right architecture that say the release's
// version, an SBOM that lists every Go module each binary holds, the release notes, the image tagged
// with the version and named by its digest in every rendered manifest, Debian packages of each
// architecture. HALE_RELEASE_DIR names the release to check (test/run cuts one); without it the test
// cuts one itself (as root: the image needs mmdebstrap and umoci; kubectl from test/kube/build-assets).
package release

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/kubeassets"
)

// version is the release CHANGELOG.md announces first (its "## … vX.Y.Z" heading).
func version(t *testing.T) string {
	b, err := os.ReadFile("../../CHANGELOG.md")
	require.NoError(t, err)
	v := regexp.MustCompile(`(?m)^## .*?\b(v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?)`).FindSubmatch(b)
	require.NotNil(t, v, "CHANGELOG.md names no version in a heading")
	return string(v[1])
}

func TestRelease(t *testing.T) {
	v := version(t)
	dir := os.Getenv("HALE_RELEASE_DIR")
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "dist")
		cmd := exec.Command("../../deploy/release", v, dir)
		cmd.Env = append(os.Environ(), "KUBECTL="+filepath.Join(kubeassets.Dir(), "kubectl")) // test/kube/build-assets
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}

	// SHA256SUMS: every artifact, each sum right.
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	require.NoError(t, err)
	listed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		require.True(t, ok, "SHA256SUMS line %q", line)
		assert.Equal(t, sum, sha256Of(t, filepath.Join(dir, name)), "the SHA-256 of %s", name)
		listed[name] = true
	}
	files, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, f := range files {
		if f.Name() != "SHA256SUMS" {
			assert.True(t, listed[f.Name()], "%s is not in SHA256SUMS", f.Name())
		}
	}
	deb := strings.TrimPrefix(v, "v")
	want := []string{"hale_" + v + "_linux_amd64.tar.gz", "hale_" + v + "_linux_arm64.tar.gz",
		"hale_" + v + "_image_linux_amd64.tar", "hale_" + v + ".spdx.json", "RELEASE_NOTES.md",
		"hale-crds.yaml", "hale-agent.service", "hale-hub.service", "inventory.example.yaml"}
	entries, err := os.ReadDir("../../deploy/overlays")
	require.NoError(t, err)
	// Every overlay, and a management cluster's install with a workload cluster's agents.
	manifests := []string{"management", "workload"}
	for _, o := range entries {
		manifests = append(manifests, o.Name())
	}
	for _, m := range manifests {
		want = append(want, "hale-"+m+".yaml")
	}
	for _, arch := range []string{"amd64", "arm64"} {
		want = append(want, "hale-agent_"+deb+"_"+arch+".deb", "hale-hub_"+deb+"_"+arch+".deb")
	}
	for _, w := range want {
		assert.True(t, listed[w], "%s missing from the release", w)
	}

	// The binaries: static, of their archive's architecture, built from Hale's commands; those this
	// machine runs say the version.
	binaries := map[string]string{} // "hub (linux/amd64)" → SHA-256
	modules := map[string]bool{}    // the package URL of every module in a binary
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		unpacked := untar(t, filepath.Join(dir, "hale_"+v+"_linux_"+arch+".tar.gz"))
		for _, name := range []string{"hub", "agent", "hale-demo"} {
			path := filepath.Join(unpacked, "hale_"+v+"_linux_"+arch, name)
			f, err := elf.Open(path)
			require.NoError(t, err, "%s in the %s archive", name, arch)
			assert.Equal(t, machine, f.Machine, "%s (%s)", name, arch)
			for _, p := range f.Progs {
				assert.NotEqual(t, elf.PT_INTERP, p.Type, "%s (%s) is dynamically linked", name, arch)
			}
			_ = f.Close()
			info, err := buildinfo.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, "github.com/hale-dev/hale/cmd/"+name, info.Path)
			binaries[name+" (linux/"+arch+")"] = sha256Of(t, path)
			for _, m := range info.Deps {
				if m.Replace != nil {
					m = m.Replace
				}
				modules["pkg:golang/"+m.Path+"@"+m.Version] = true
			}
			if arch == runtime.GOARCH && name != "hale-demo" {
				out, err := exec.Command(path, "version", "-o", "json").Output()
				require.NoError(t, err, "%s version", name)
				var got struct{ Version string }
				require.NoError(t, json.Unmarshal(out, &got), "%s", out)
				assert.Equal(t, v, got.Version, "%s version", name)
			}
		}
	}

	// The SBOM: each binary with its checksum, every module of it a package it contains.
	var sbom struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			SPDXID, Name, VersionInfo string
			Checksums                 []struct{ Algorithm, ChecksumValue string }
			ExternalRefs              []struct{ ReferenceType, ReferenceLocator string }
		}
		Relationships []struct {
			Element string `json:"spdxElementId"`
			Type    string `json:"relationshipType"`
			Related string `json:"relatedSpdxElement"`
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "hale_"+v+".spdx.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &sbom))
	assert.Equal(t, "SPDX-2.3", sbom.SPDXVersion)
	byID := map[string]string{}
	purls := map[string]bool{}
	for _, p := range sbom.Packages {
		byID[p.SPDXID] = p.Name
		if sum, ok := binaries[p.Name]; ok {
			require.Len(t, p.Checksums, 1, p.Name)
			assert.Equal(t, sum, p.Checksums[0].ChecksumValue, "the SBOM's SHA-256 of %s", p.Name)
			delete(binaries, p.Name)
		}
		for _, r := range p.ExternalRefs {
			if r.ReferenceType == "purl" {
				purls[r.ReferenceLocator] = true
			}
		}
	}
	assert.Empty(t, binaries, "binaries missing from the SBOM")
	contains := 0
	for _, r := range sbom.Relationships {
		if r.Type == "CONTAINS" {
			contains++
			assert.NotEmpty(t, byID[r.Related], "a relationship to no package: %s", r.Related)
		}
	}
	assert.Positive(t, contains)
	require.NotEmpty(t, modules)
	for m := range modules {
		assert.True(t, purls[m], "the SBOM lists %s", m)
	}

	notes, err := os.ReadFile(filepath.Join(dir, "RELEASE_NOTES.md"))
	require.NoError(t, err)
	assert.Regexp(t, `^## .*`+regexp.QuoteMeta(v), string(notes))

	// The image: an OCI archive whose one manifest is tagged with the version; each rendered manifest
	// names it by that digest, and only it.
	tag, digest := imageTag(t, filepath.Join(dir, "hale_"+v+"_image_linux_amd64.tar"))
	assert.Equal(t, v, tag)
	images := regexp.MustCompile(`(?m)^\s+image: (\S+)$`)
	for _, o := range manifests {
		b, err := os.ReadFile(filepath.Join(dir, "hale-"+o+".yaml"))
		require.NoError(t, err)
		found := images.FindAllStringSubmatch(string(b), -1)
		assert.NotEmpty(t, found, "hale-%s.yaml names no image", o)
		for _, m := range found {
			assert.Equal(t, "ghcr.io/hale-dev/hale:"+v+"@"+digest, m[1], "hale-%s.yaml", o)
		}
		if o != "workload" { // the agents alone: the hub in the management cluster has the CRDs
			assert.Contains(t, string(b), "kind: CustomResourceDefinition", "hale-%s.yaml is a whole install", o)
		}
	}

	// The Debian packages: of their architecture and the release's version, each with its binary
	// (the release's own) and unit.
	for _, arch := range []string{"amd64", "arm64"} {
		for _, program := range []string{"agent", "hub"} {
			pkg := filepath.Join(dir, "hale-"+program+"_"+deb+"_"+arch+".deb")
			out, err := exec.Command("dpkg-deb", "-f", pkg, "Package", "Version", "Architecture").Output()
			require.NoError(t, err, "dpkg-deb -f %s", pkg)
			assert.Equal(t, "Package: hale-"+program+"\nVersion: "+deb+"\nArchitecture: "+arch+"\n", string(out))
			out, err = exec.Command("dpkg-deb", "-c", pkg).Output()
			require.NoError(t, err)
			assert.Regexp(t, `-rwxr-xr-x root/root .* ./usr/bin/`+program+`\n`, string(out))
			assert.Contains(t, string(out), "./usr/lib/systemd/system/hale-"+program+".service")
		}
	}
}

// A version that is no version, and one the changelog does not announce: refused before anything is
// built, saying what to do.
func TestReleaseRefusesBadInput(t *testing.T) {
	for _, tc := range []struct{ version, want string }{
		{"1.2", "1.2 is not a version: want v1.2.3"},
		{"v9.9.9", "CHANGELOG.md has no section for v9.9.9"},
	} {
		dir := t.TempDir()
		out, err := exec.Command("../../deploy/release", tc.version, dir).CombinedOutput()
		require.Error(t, err, "%s", out)
		assert.Equal(t, 2, err.(*exec.ExitError).ExitCode())
		assert.Contains(t, string(out), tc.want)
		entries, _ := os.ReadDir(dir)
		assert.Empty(t, entries, "nothing built")
	}
}

func sha256Of(t *testing.T, path string) string {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// untar unpacks a .tar.gz into a new directory.
func untar(t *testing.T, archive string) string {
	f, err := os.Open(archive)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	dir := t.TempDir()
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		require.NoError(t, err)
		target := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(target, 0o755))
		case tar.TypeReg:
			require.NoError(t, os.MkdirAll(filepath.Dir(target), 0o755))
			w, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode))
			require.NoError(t, err)
			_, err = io.Copy(w, tr)
			require.NoError(t, err)
			require.NoError(t, w.Close())
		}
	}
}

// imageTag is the ref name and the digest of the one manifest in an OCI image archive's index.json.
func imageTag(t *testing.T, archive string) (tag, digest string) {
	f, err := os.Open(archive)
	require.NoError(t, err)
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		require.NoError(t, err, "no index.json in %s", archive)
		if filepath.Clean(h.Name) != "index.json" {
			continue
		}
		var index struct {
			Manifests []struct {
				Digest      string
				Annotations map[string]string
			}
		}
		require.NoError(t, json.NewDecoder(tr).Decode(&index))
		require.Len(t, index.Manifests, 1)
		return index.Manifests[0].Annotations["org.opencontainers.image.ref.name"], index.Manifests[0].Digest
	}
}
