package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An operator command pointed at a server that is not the hub's operator API (the metrics port, any
// other HTTP server) says so and what to point it at, with the exit code of an unreachable hub.
func TestOperatorCommandAtAnotherServer(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte("a-token-long-enough-0123\n"), 0o600))
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{"404 text", http.NotFound, `answered 404 Not Found ("404 page not found")`},
		{"200, not JSON", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "# HELP go_goroutines\n") },
			"answered 200 OK to GET /v1/status, which is no answer of Hale's"},
		{"500, empty", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) },
			`answered 500 Internal Server Error ("")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			_, stderr, code := hubRun(t, "status", "--api-address", strings.TrimPrefix(srv.URL, "http://"), "--token-file", token)
			assert.Equal(t, exitUnreachable, code, stderr)
			assert.Contains(t, stderr, tc.want)
			assert.Contains(t, stderr, "that is not the hub's operator API")
		})
	}
}
