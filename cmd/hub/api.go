package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/internal/secretfile"
)

// term is the hub in charge and its metrics.
type term struct {
	hub *hub.Hub
	reg *prometheus.Registry
}

// termHandler serves the operator API of the hub in charge, or says that this replica stands by and,
// when leads is given, who leads.
func termHandler(current *atomic.Pointer[term], leads func(context.Context) string, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := current.Load()
		if t == nil {
			answer := "this hub replica stands by: another one leads; ask the leader"
			if leads != nil {
				answer = leads(r.Context())
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": answer})
			return
		}
		t.hub.APIHandler(token).ServeHTTP(w, r)
	})
}

func splitHostPort(flag, s string) (string, int, error) {
	host, port, err := net.SplitHostPort(s)
	if err == nil {
		var p int
		if p, err = strconv.Atoi(port); err == nil && p >= 0 && p < 65536 {
			return host, p, nil
		}
	}
	return "", 0, fmt.Errorf("%s %q: want host:port", flag, s)
}

// apiListener is one listener of the operator API and the token it requires (none on the socket,
// whose file mode is the access control).
type apiListener struct {
	ln    net.Listener
	token string
}

// listenAPI opens the operator API's listeners: the Unix socket (mode 0600, its directory created
// 0750; a stale socket left by a crash is replaced, a live one is an error) and the loopback TCP
// address, which requires a token file.
func listenAPI(a apiListen) ([]apiListener, error) {
	var lns []apiListener
	if a.socket != "" {
		if err := os.MkdirAll(filepath.Dir(a.socket), 0o750); err != nil {
			return nil, fmt.Errorf("--socket %s: %w", a.socket, err)
		}
		if c, err := net.DialTimeout("unix", a.socket, time.Second); err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("--socket %s: another hub is serving on it", a.socket)
		}
		_ = os.Remove(a.socket)
		old := syscall.Umask(0o177)
		ln, err := net.Listen("unix", a.socket)
		syscall.Umask(old)
		if err != nil {
			return nil, fmt.Errorf("--socket %s: %w", a.socket, err)
		}
		lns = append(lns, apiListener{ln: ln})
	}
	if a.address != "" {
		fail := func(err error) ([]apiListener, error) {
			closeAll(lns)
			return nil, err
		}
		host, _, err := net.SplitHostPort(a.address)
		if ip := net.ParseIP(host); err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
			return fail(fmt.Errorf("--api-address %q: must be a loopback host:port (the API can reboot machines)", a.address))
		}
		token, err := readToken("api-token-file", a.tokenFile)
		if err != nil {
			return fail(err)
		}
		ln, err := net.Listen("tcp", a.address)
		if err != nil {
			return fail(fmt.Errorf("--api-address %s: %w", a.address, err))
		}
		lns = append(lns, apiListener{ln: ln, token: token})
	}
	return lns, nil
}

func closeAll(lns []apiListener) {
	for _, l := range lns {
		_ = l.ln.Close()
	}
}

func closeAPI(lns []apiListener, a apiListen) {
	closeAll(lns)
	if a.socket != "" {
		_ = os.Remove(a.socket)
	}
}

// readToken reads an API token file given by the flag named flag: one line of at least 16 characters.
func readToken(flag, path string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("--%s is required with --api-address (make one with: head -c 24 /dev/urandom | base64 > token)", flag)
	}
	b, err := secretfile.Read(path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flag, err)
	}
	token := strings.TrimSpace(string(b))
	if len(token) < 16 || strings.ContainsAny(token, " \t\r\n") {
		return "", fmt.Errorf("--%s %s: want one line of at least 16 characters without spaces", flag, path)
	}
	return token, nil
}
