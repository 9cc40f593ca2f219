package health

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hale-dev/hale/internal/secretfile"
)

// TLSFiles are the PEM files of a TLS client: the CA to verify the server with and, optionally, a
// client certificate and key. Empty CA means the system pool.
type TLSFiles struct {
	// CA is the file of CA certificates the server's certificate is checked against (PEM).
	CA string `json:"ca"`
	// Cert is the client certificate (PEM), when the server asks for one.
	Cert string `json:"cert"`
	// Key is the client certificate's private key (PEM).
	Key string `json:"key"`
}

// Config builds a TLS client configuration, naming the file that is wrong.
func (f TLSFiles) Config() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate in it", f.CA)
		}
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, fmt.Errorf("client certificate %q and key %q: give both or neither", f.Cert, f.Key)
	}
	if f.Cert != "" {
		cert, err := os.ReadFile(f.Cert)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		key, err := secretfile.Read(f.Key)
		if err != nil {
			return nil, fmt.Errorf("client key: %w", err)
		}
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s / key %s: %w", f.Cert, f.Key, err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// httpProbe passes when GET url answers 200 (and, when set, a body containing want).
type httpProbe struct {
	name   string
	url    string
	want   string
	client *http.Client
	detail string // said with a failed request (what the certificate is checked for)
}

func newHTTPProbe(name, url, want string, files TLSFiles) (*httpProbe, error) {
	// Keep-alive: a TLS handshake every second would cost more than the check itself. A connection to
	// a server that died fails the next check, and the one after dials afresh.
	transport := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: 30 * time.Second}
	if strings.HasPrefix(url, "https://") {
		c, err := files.Config()
		if err != nil {
			return nil, fmt.Errorf("probe %s: %w", name, err)
		}
		transport.TLSClientConfig = c
	}
	return &httpProbe{name: name, url: url, want: want, client: &http.Client{Transport: transport}}, nil
}

func (p *httpProbe) Name() string { return p.name }

func (p *httpProbe) Check(ctx context.Context) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return false, fmt.Sprintf("GET %s%s: %v", p.url, p.detail, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	text := strings.TrimSpace(string(body))
	switch {
	case resp.StatusCode != http.StatusOK:
		return false, fmt.Sprintf("GET %s: HTTP %d: %s", p.url, resp.StatusCode, firstLine(text))
	case p.want != "" && !strings.Contains(text, p.want):
		return false, fmt.Sprintf("GET %s: HTTP 200 but %q, want %q", p.url, firstLine(text), p.want)
	}
	return true, fmt.Sprintf("GET %s: %s", p.url, firstLine(text))
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
