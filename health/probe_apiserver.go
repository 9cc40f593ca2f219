package health

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
	if files.CA == "" {
		files.CA = DefaultKubeCA
	}
	return newHTTPProbe("apiserver", url, "ok", files)
}
