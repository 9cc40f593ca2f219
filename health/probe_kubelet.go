package health

// DefaultKubeletURL is the kubelet's local health endpoint (its --healthz-port, plain HTTP).
const DefaultKubeletURL = "http://127.0.0.1:10248/healthz"

// NewKubeletProbe passes while the kubelet's /healthz answers "ok".
func NewKubeletProbe(url string) (Probe, error) {
	if url == "" {
		url = DefaultKubeletURL
	}
	return newHTTPProbe("kubelet", url, "ok", TLSFiles{})
}
