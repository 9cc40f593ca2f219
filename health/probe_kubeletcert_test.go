package health

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The kubelet certificate probe reads the certificate the way the kubelet writes it (certificate,
// then key, in one file) and fails when it expires within minValidity.
func TestKubeletCertProbe(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	write := func(name string, notAfter time.Time) string {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "system:node:cp-0"},
			NotBefore: now.Add(-time.Hour), NotAfter: notAfter}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		require.NoError(t, err)
		kb, err := x509.MarshalECPrivateKey(key)
		require.NoError(t, err)
		path := filepath.Join(dir, name)
		pemBytes := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})...)
		require.NoError(t, os.WriteFile(path, pemBytes, 0o600))
		return path
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "junk.pem"), []byte("not a certificate"), 0o600))
	for _, tc := range []struct {
		name, file string
		ok         bool
		detail     string
	}{
		{name: "valid for a year", file: write("year.pem", now.AddDate(1, 0, 0)), ok: true, detail: "expires 2027-11-25T12:00:00Z (in 8760h0m0s)"},
		{name: "valid for 2 hours: rotation failing", file: write("soon.pem", now.Add(2*time.Hour)),
			detail: "(in 2h0m0s), less than 24h0m0s: the kubelet's certificate rotation is failing"},
		{name: "expired", file: write("expired.pem", now.Add(-time.Minute)), detail: "(in -1m0s), less than 24h0m0s"},
		{name: "missing", file: filepath.Join(dir, "none.pem"), detail: "cannot read the kubelet's certificate"},
		{name: "not PEM", file: filepath.Join(dir, "junk.pem"), detail: "no PEM certificate in it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &KubeletCertSection{File: tc.file}
			p, err := s.New(ProbeEnv{})
			require.NoError(t, err)
			p.(*kubeletCertProbe).now = func() time.Time { return now }
			ok, detail := p.Check(t.Context())
			assert.Equal(t, tc.ok, ok, detail)
			assert.Contains(t, detail, tc.detail)
		})
	}
	k, err := LookupProbe("kubeletCert")
	require.NoError(t, err)
	s := k.Section()
	k.Defaults(s, true)
	assert.False(t, *s.Common().Enabled, "opt-in: off unless its section enables it")
	assert.Equal(t, time.Minute, s.Common().Interval.Duration)
}
