package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The SBOM of the agent, built here as a release builds it: the binary with its checksum, and the
// modules compiled into it (memberlist among them), each with its package URL; a file that is no Go
// binary is refused by name.
func TestDocument(t *testing.T) {
	agent := filepath.Join(t.TempDir(), "agent")
	build := exec.Command("go", "build", "-trimpath", "-o", agent, "../../cmd/agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	doc, err := Document("v0.0.1", []string{agent}, time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	var d struct {
		SPDXVersion  string `json:"spdxVersion"`
		CreationInfo struct{ Created string }
		Packages     []struct {
			Name         string
			Checksums    []struct{ ChecksumValue string }
			ExternalRefs []struct{ ReferenceLocator string }
		}
	}
	require.NoError(t, json.Unmarshal(b, &d))
	assert.Equal(t, "SPDX-2.3", d.SPDXVersion)
	assert.Equal(t, "2026-11-27T00:00:00Z", d.CreationInfo.Created)
	require.NotEmpty(t, d.Packages)
	sum, err := fileSHA256(agent)
	require.NoError(t, err)
	assert.Equal(t, sum, d.Packages[0].Checksums[0].ChecksumValue, d.Packages[0].Name)
	var memberlist bool
	for _, p := range d.Packages[1:] {
		require.Len(t, p.ExternalRefs, 1, p.Name)
		memberlist = memberlist || p.Name == "github.com/hashicorp/memberlist"
	}
	assert.True(t, memberlist, "memberlist listed")

	notGo := filepath.Join(t.TempDir(), "README")
	require.NoError(t, os.WriteFile(notGo, []byte("text"), 0o644))
	_, err = Document("v0.0.1", []string{notGo}, time.Now())
	require.ErrorContains(t, err, notGo+": ")
	assert.ErrorContains(t, err, "a Go binary is needed")
}
