package cli

import (
	"log/slog"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The shared flags parse as both binaries declare them, and a wrong level names the flag.
func TestSharedFlags(t *testing.T) {
	var level, file, pinned string
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	LogLevelFlag(fs, &level)
	IdentityFlags(fs, &file, &pinned, "this node's", "its node name")
	require.NoError(t, fs.Parse([]string{"--identity-file", "/k", "--pinned-file", "/p"}))
	assert.Equal(t, "/k", file)
	assert.Equal(t, "/p", pinned)
	l, err := LogLevel(level)
	require.NoError(t, err)
	assert.Equal(t, slog.LevelInfo, l, "the default")
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "WARN": slog.LevelWarn, "error": slog.LevelError} {
		l, err := LogLevel(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, l, in)
	}
	_, err = LogLevel("verbose")
	assert.EqualError(t, err, `--log-level "verbose": want debug, info, warn or error`)
}
