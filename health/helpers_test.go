package health

import (
	"encoding/pem"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func writeFile(path, body string) error { return os.WriteFile(path, []byte(body), 0o600) }

// durationFromEnv reads a number of seconds from the environment variable name, else def.
func durationFromEnv(t testing.TB, name string, def time.Duration) time.Duration {
	t.Helper()
	if s := os.Getenv(name); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, name)
		return time.Duration(n) * time.Second
	}
	return def
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func pemOf(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
