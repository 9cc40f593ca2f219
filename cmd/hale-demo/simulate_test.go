package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/internal/cli"
	"github.com/hale-dev/hale/test/capture"
)

// The simulator prints a command that works: its endpoint, credentials and CA, read here by the
// same BMC client the hub uses.
func TestBMCSimulator(t *testing.T) {
	dir := t.TempDir()
	out := &capture.Buffer{}
	cmd := newSimulateCommand()
	cmd.SetOut(out)
	cmd.SetArgs([]string{"--listen", "127.0.0.1:0", "--state-dir", dir, "--system", "a,b"})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "try:") }, 5*time.Second, 10*time.Millisecond)
	text := out.String()
	assert.Contains(t, text, "bmcsim: serving redfish://127.0.0.1:")
	assert.Contains(t, text, "(systems: a, b)")
	require.FileExists(t, filepath.Join(dir, "ca.pem"))

	// hub bmc power status ENDPOINT --credentials FILE --ca-file FILE
	f := strings.Fields(strings.SplitN(text[strings.Index(text, "try:")+len("try:"):], "\n", 2)[0])
	require.Len(t, f, 9, "%q", f)
	ep, err := bmc.ParseEndpoint(f[4])
	require.NoError(t, err)
	creds, err := bmc.LoadCredentials(f[6])
	require.NoError(t, err)
	c, err := bmc.New(ep, creds, bmc.Options{CAFile: f[8]})
	require.NoError(t, err)
	st, _, err := c.Status(t.Context())
	require.NoError(t, err)
	assert.Equal(t, bmc.PowerOn, st)
	cancel()
	require.NoError(t, <-done)
}

// Every command's help reads right and has examples that give it only flags it has.
func TestHelpReadsRight(t *testing.T) {
	assert.Empty(t, cli.HelpProblems(newRootCommand()))
}
