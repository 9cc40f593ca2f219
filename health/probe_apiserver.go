package health

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"
)

func init() {
	RegisterProbe(ProbeKind{Name: "apiserver", Judged: 10 * time.Second, Section: func() ProbeSection { return &APIServerSection{} },
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
}

// New makes the API server probe.
func (s *APIServerSection) New(ProbeEnv) (Probe, error) { return NewAPIServerProbe(s.URL, s.TLS) }

// Paths are its TLS files.
func (s *APIServerSection) Paths() []*string { return []*string{&s.TLS.CA, &s.TLS.Cert, &s.TLS.Key} }

// Defaults for the local kube-apiserver, as kubeadm lays it out. /livez is readable without
// credentials (system:public-info-viewer), so only the CA is needed.
const (
	DefaultAPIServerURL = "https://127.0.0.1:6443/livez"
	DefaultKubeCA       = "/etc/kubernetes/pki/ca.crt"
)

// NewAPIServerProbe passes while the local kube-apiserver's /livez answers "ok".
func NewAPIServerProbe(url string, files TLSFiles) (Probe, error) {
	if url == "" {
		url = DefaultAPIServerURL
	}
	if files.CA == "" && strings.HasPrefix(url, "https://") { // plain http:// takes no CA
		files.CA = DefaultKubeCA
		if err := kubeadmDefault(files.CA, "probes.apiserver.tls.ca", "probes.apiserver.enabled: false"); err != nil {
			return nil, fmt.Errorf("probe apiserver: %w", err)
		}
	}
	return newHTTPProbe("apiserver", url, "ok", files)
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
