package health

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"strings"

	"github.com/hale-dev/hale/health/report"
)

func init() {
	RegisterProbe(ProbeKind{Name: "apiserver", Judged: report.JudgedTimeouts()["apiserver"], Section: func() ProbeSection { return &APIServerSection{} },
		Help: "the local kube-apiserver's /livez answers ok (`url`, default " + DefaultAPIServerURL + "; `tls.ca`, default " + DefaultKubeCA + ")"})
}

// APIServerSection is probes.apiserver.
type APIServerSection struct {
	ProbeSettings
	// URL is the API server's health endpoint (default https://127.0.0.1:6443/livez, readable
	// without credentials).
	URL string `json:"url"`
	// TLS: the CA the API server's certificate is checked against (default kubeadm's
	// /etc/kubernetes/pki/ca.crt); a client certificate only if /livez needs one.
	TLS TLSFiles `json:"tls"`
	// ServerName is the name the API server's certificate must be valid for. Default, when the URL's
	// host is a loopback address: kubernetes, which kubeadm (and every distribution that follows it)
	// puts in each API server's certificate, where 127.0.0.1 is not; otherwise the URL's host.
	ServerName string `json:"serverName"`
}

// New makes the API server probe.
func (s *APIServerSection) New(ProbeEnv) (Probe, error) {
	return NewAPIServerProbe(s.URL, s.TLS, s.ServerName)
}

// Paths are its TLS files.
func (s *APIServerSection) Paths() []*string { return []*string{&s.TLS.CA, &s.TLS.Cert, &s.TLS.Key} }

// Defaults for the local kube-apiserver, as kubeadm lays it out. /livez is readable without
// credentials (system:public-info-viewer), so only the CA is needed.
const (
	DefaultAPIServerURL = "https://127.0.0.1:6443/livez"
	DefaultKubeCA       = "/etc/kubernetes/pki/ca.crt"
)

// DefaultAPIServerName is the name an API server reached at a loopback address is checked for: the
// service's name, in every API server certificate kubeadm makes (127.0.0.1 is in none of them: a probe
// checking the URL's host failed on every kubeadm machine).
const DefaultAPIServerName = "kubernetes"

// NewAPIServerProbe passes while the local kube-apiserver's /livez answers "ok", its certificate
// checked for serverName (default: DefaultAPIServerName for a loopback URL, else the URL's host).
func NewAPIServerProbe(rawURL string, files TLSFiles, serverName string) (Probe, error) {
	url := rawURL
	if url == "" {
		url = DefaultAPIServerURL
	}
	u, err := neturl.Parse(url)
	if err != nil {
		return nil, fmt.Errorf("probe apiserver: url %q: %w", url, err)
	}
	if ip := net.ParseIP(u.Hostname()); serverName == "" && u.Scheme == "https" && (u.Hostname() == "localhost" || ip != nil && ip.IsLoopback()) {
		serverName = DefaultAPIServerName
	}
	if files.CA == "" && strings.HasPrefix(url, "https://") { // plain http:// takes no CA
		files.CA = DefaultKubeCA
		if err := kubeadmDefault(files.CA, "probes.apiserver.tls.ca", "probes.apiserver.enabled: false"); err != nil {
			return nil, fmt.Errorf("probe apiserver: %w", err)
		}
	}
	p, err := newHTTPProbe("apiserver", url, "ok", files)
	if err != nil {
		return nil, err
	}
	if c := p.client.Transport.(*http.Transport).TLSClientConfig; c != nil && serverName != "" {
		c.ServerName = serverName
		p.detail = " (certificate checked for " + serverName + ")"
	}
	return p, nil
}

// kubeadmDefault says, when path (a default where kubeadm puts a file) is not on this host, which
// setting names the file instead and how to turn off what needs it: a host laid out otherwise (k3s,
// RKE2, a distribution of its own) learns that from the error, not from a probe failing forever.
func kubeadmDefault(path, setting, off string) error {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s defaults to %s (where kubeadm puts it), which is not on this host: set %s, or %s", setting, path, setting, off)
	}
	return nil
}
