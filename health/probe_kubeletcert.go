package health

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"time"

	"github.com/hale-dev/hale/config"
)

// DefaultKubeletCert is the kubelet's current client certificate, as kubeadm lays it out.
const DefaultKubeletCert = "/var/lib/kubelet/pki/kubelet-client-current.pem"

func init() {
	RegisterProbe(ProbeKind{Name: "kubeletCert", Interval: time.Minute, Timeout: time.Second, OptIn: true,
		Section: func() ProbeSection { return &KubeletCertSection{} },
		Help: "opt-in: the kubelet's certificate (`file`, default " + DefaultKubeletCert + ") is valid for more than `minValidity` (24h): " +
			"the kubelet renews it well before, so less means its rotation is failing and the node will drop out of the cluster when it expires"})
}

// KubeletCertSection is probes.kubeletCert.
type KubeletCertSection struct {
	ProbeSettings
	// File is the kubelet's client certificate (default
	// /var/lib/kubelet/pki/kubelet-client-current.pem).
	File string `json:"file"`
	// MinValidity: the probe fails when the certificate expires sooner than this (default 24 h).
	MinValidity config.Duration `json:"minValidity"`
}

// New makes the probe.
func (s *KubeletCertSection) New(ProbeEnv) (Probe, error) {
	p := &kubeletCertProbe{file: s.File, min: s.MinValidity.Or(24 * time.Hour), now: time.Now}
	if p.file == "" {
		p.file = DefaultKubeletCert
	}
	return p, nil
}

// Paths is its certificate file.
func (s *KubeletCertSection) Paths() []*string { return []*string{&s.File} }

type kubeletCertProbe struct {
	file string
	min  time.Duration
	now  func() time.Time
}

func (p *kubeletCertProbe) Name() string { return "kubeletCert" }

// Check reads the first certificate in the file (the kubelet's file holds the certificate and its key)
// and fails when it expires within min.
func (p *kubeletCertProbe) Check(context.Context) (bool, string) {
	b, err := os.ReadFile(p.file)
	if err != nil {
		return false, fmt.Sprintf("cannot read the kubelet's certificate: %v", err)
	}
	for rest := b; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return false, fmt.Sprintf("%s: no PEM certificate in it", p.file)
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return false, fmt.Sprintf("%s: %v", p.file, err)
		}
		left := cert.NotAfter.Sub(p.now())
		detail := fmt.Sprintf("%s expires %s (in %v)", p.file, cert.NotAfter.UTC().Format(time.RFC3339), left.Round(time.Minute))
		if left < p.min {
			return false, detail + fmt.Sprintf(", less than %v: the kubelet's certificate rotation is failing (check the kubelet's log and its CSRs)", p.min)
		}
		return true, detail
	}
}
