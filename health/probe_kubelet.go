package health

import "github.com/hale-dev/hale/health/report"

func init() {
	RegisterProbe(ProbeKind{Name: "kubelet", Judged: report.JudgedTimeouts()["kubelet"], Section: func() ProbeSection { return &KubeletSection{} },
		Help: "the kubelet's health endpoint answers ok (`url`, default " + DefaultKubeletURL + ")"})
}

// KubeletSection is probes.kubelet.
type KubeletSection struct {
	ProbeSettings
	// URL is the kubelet's health endpoint (default http://127.0.0.1:10248/healthz).
	URL string `json:"url"`
}

// New makes the kubelet probe.
func (s *KubeletSection) New(ProbeEnv) (Probe, error) { return NewKubeletProbe(s.URL) }

// DefaultKubeletURL is the kubelet's local health endpoint (its --healthz-port, plain HTTP).
const DefaultKubeletURL = "http://127.0.0.1:10248/healthz"

// NewKubeletProbe passes while the kubelet's /healthz answers "ok".
func NewKubeletProbe(url string) (Probe, error) {
	if url == "" {
		url = DefaultKubeletURL
	}
	return newHTTPProbe("kubelet", url, "ok", TLSFiles{})
}
