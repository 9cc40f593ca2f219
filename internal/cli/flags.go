package cli

import (
	"fmt"
	"log/slog"

	"github.com/spf13/pflag"
)

// The flags the agent and the hub share are declared here once: the same name, default, help and
// check on both.

// LogLevelFlag declares --log-level into level (LogLevel reads it).
func LogLevelFlag(fs *pflag.FlagSet, level *string) {
	fs.StringVar(level, "log-level", "info", "debug, info, warn or error")
}

// LogLevel is --log-level's value as a level; the error names the flag and what it takes.
func LogLevel(s string) (slog.Level, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(s)); err != nil {
		return level, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return level, nil
}

// IdentityFlags declares --identity-file (into file: the signing key of whose, created when missing,
// pinned under the name pinnedAs) and --pinned-file (into pinned: every member's public key), which go
// together.
func IdentityFlags(fs *pflag.FlagSet, file, pinned *string, whose, pinnedAs string) {
	fs.StringVar(file, "identity-file", "", fmt.Sprintf("%s signing key (created when missing; pinned as %s in the pinned-keys file; with --pinned-file)", whose, pinnedAs))
	fs.StringVar(pinned, "pinned-file", "", "every member's public key, one NAME ed25519:BASE64 a line (with --identity-file)")
}
