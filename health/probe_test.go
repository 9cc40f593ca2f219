package health

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type fakeProbe struct {
	name  string
	ok    atomic.Bool
	delay atomic.Int64 // nanoseconds
}

func (p *fakeProbe) Name() string { return p.name }
func (p *fakeProbe) Check(ctx context.Context) (bool, string) {
	select {
	case <-time.After(time.Duration(p.delay.Load())):
	case <-ctx.Done():
	}
	return p.ok.Load(), "fake"
}

func TestRunnerTracksSince(t *testing.T) {
	p := &fakeProbe{name: "a"}
	p.ok.Store(true)
	var changes atomic.Int32
	r, err := NewRunner([]ProbeSpec{{Probe: p, Interval: 10 * time.Millisecond, Timeout: 5 * time.Millisecond}}, nil, func() { changes.Add(1) })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	require.Eventually(t, func() bool { return len(r.Results()) == 1 }, time.Second, 5*time.Millisecond)
	first := r.Results()[0]
	time.Sleep(50 * time.Millisecond)
	again := r.Results()[0]
	assert.True(t, again.OK)
	assert.Equal(t, first.Since, again.Since, "still passing: since does not move")
	assert.True(t, again.CheckedAt.After(first.CheckedAt))

	p.ok.Store(false)
	require.Eventually(t, func() bool { return !r.Results()[0].OK }, time.Second, 5*time.Millisecond)
	assert.True(t, r.Results()[0].Since.After(first.Since), "failing: since moves to the flip")
	assert.Equal(t, int32(2), changes.Load())

	p.ok.Store(true)
	p.delay.Store(int64(50 * time.Millisecond)) // now it times out
	time.Sleep(60 * time.Millisecond)
	res := r.Results()[0]
	assert.False(t, res.OK)
	assert.Equal(t, "no answer within 5ms", res.Detail)
	cancel()
	<-done
}

// A probe is reported failing only once FailureThreshold checks in a row failed, and then as failing
// since the first of them; one failed check between passing ones is never reported (a slow answer on
// a busy machine made the hub call a healthy machine Suspect, each time an Event in Kubernetes mode).
func TestRunnerFailureThreshold(t *testing.T) {
	for _, tc := range []struct {
		threshold int
		script    string // the checks' outcomes: + passes, - fails
		want      string // what is reported after each check
		changes   int32
	}{
		{threshold: 0, script: "+-+--+", want: "++++-+", changes: 3},
		{threshold: 2, script: "+-+---+", want: "++++--+", changes: 3},
		{threshold: 1, script: "+-+--+", want: "+-+--+", changes: 5},
		{threshold: 3, script: "+--+---", want: "++++++-", changes: 2},
		{threshold: 2, script: "-+", want: "-+", changes: 2}, // the first check has no history to smooth
	} {
		t.Run(fmt.Sprintf("%d %s", tc.threshold, tc.script), func(t *testing.T) {
			p := &fakeProbe{name: "a"}
			var changes atomic.Int32
			r, err := NewRunner([]ProbeSpec{{Probe: p, Interval: time.Second, Timeout: time.Second, FailureThreshold: tc.threshold}}, nil, func() { changes.Add(1) })
			require.NoError(t, err)
			var got strings.Builder
			var streakStart time.Time
			for i, c := range tc.script {
				p.ok.Store(c == '+')
				r.CheckAll(t.Context())
				res := r.Results()[0]
				if c == '-' && (i == 0 || tc.script[i-1] == '+') {
					streakStart = res.CheckedAt
				}
				if res.OK {
					got.WriteByte('+')
					continue
				}
				got.WriteByte('-')
				assert.Equal(t, streakStart, res.Since, "check %d: failing since the first failure in a row", i)
			}
			assert.Equal(t, tc.want, got.String())
			assert.Equal(t, tc.changes, changes.Load(), "state changes announced")
		})
	}
}

func TestRunnerRejectsBadSpecs(t *testing.T) {
	p := &fakeProbe{name: "a"}
	for _, tc := range []struct {
		specs []ProbeSpec
		want  string
	}{
		{[]ProbeSpec{{Probe: p, Interval: time.Second, Timeout: time.Second}, {Probe: p, Interval: time.Second, Timeout: time.Second}}, `probes[1]: "a" is configured twice`},
		{[]ProbeSpec{{Probe: p, Interval: 0, Timeout: time.Second}}, "probe a: interval and timeout must be positive"},
		{[]ProbeSpec{{Probe: p, Interval: time.Second, Timeout: 2 * time.Second}}, "probe a: timeout 2s is longer than its interval 1s"},
		{[]ProbeSpec{{}}, "probes[0]: no probe"},
		{[]ProbeSpec{{Probe: p, Interval: time.Second, Timeout: time.Second, FailureThreshold: -1}}, "probe a: failure threshold -1 must not be negative"},
	} {
		_, err := NewRunner(tc.specs, nil, nil)
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestHTTPProbes(t *testing.T) {
	var status atomic.Int32
	status.Store(200)
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write([]byte("ok"))
	})
	plain := httptest.NewServer(handler)
	defer plain.Close()
	kubelet, err := NewKubeletProbe(plain.URL + "/healthz")
	require.NoError(t, err)
	ok, detail := check(t, kubelet, time.Second)
	assert.True(t, ok, detail)
	status.Store(500)
	ok, detail = check(t, kubelet, time.Second)
	assert.False(t, ok)
	assert.Contains(t, detail, "HTTP 500: ok")

	status.Store(200)
	tlsSrv := httptest.NewTLSServer(handler)
	defer tlsSrv.Close()
	ca := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(ca, pemOf(tlsSrv.Certificate().Raw), 0o600))
	// At a loopback address the certificate is checked for "kubernetes" (kubeadm's API server
	// certificates name it, never 127.0.0.1); httptest's names example.com.
	api, err := NewAPIServerProbe(tlsSrv.URL+"/livez", TLSFiles{CA: ca}, "")
	require.NoError(t, err)
	ok, detail = check(t, api, time.Second)
	assert.False(t, ok)
	assert.Contains(t, detail, "(certificate checked for kubernetes): ")
	assert.Contains(t, detail, "not kubernetes")
	api, err = NewAPIServerProbe(tlsSrv.URL+"/livez", TLSFiles{CA: ca}, "example.com")
	require.NoError(t, err)
	ok, detail = check(t, api, time.Second)
	assert.True(t, ok, detail)

	_, err = NewAPIServerProbe(tlsSrv.URL+"/livez", TLSFiles{CA: "/nonexistent/ca.crt"}, "")
	assert.ErrorContains(t, err, "probe apiserver: CA file: open /nonexistent/ca.crt")
	_, err = NewAPIServerProbe(tlsSrv.URL+"/livez", TLSFiles{CA: ca, Cert: "x.crt"}, "")
	assert.ErrorContains(t, err, "give both or neither")

	down, err := NewKubeletProbe("http://127.0.0.1:1/healthz")
	require.NoError(t, err)
	ok, detail = check(t, down, time.Second)
	assert.False(t, ok)
	assert.Contains(t, detail, "connection refused")
}

func TestDiskProbe(t *testing.T) {
	dir := t.TempDir()
	p, err := NewDiskProbe(dir, 1, 0.001)
	require.NoError(t, err)
	ok, detail := check(t, p, time.Second)
	assert.True(t, ok, detail)
	assert.Contains(t, detail, "free of")

	p, err = NewDiskProbe(dir, 1<<62, 0)
	require.NoError(t, err)
	ok, detail = check(t, p, time.Second)
	assert.False(t, ok)
	assert.Contains(t, detail, "want at least 4.0 EiB")

	p, _ = NewDiskProbe(filepath.Join(dir, "missing"), 0, 0)
	ok, detail = check(t, p, time.Second)
	assert.False(t, ok)
	assert.Contains(t, detail, "no such file or directory")

	_, err = NewDiskProbe(dir, 0, 150)
	assert.ErrorContains(t, err, "minFreePercent 150: want 0 to 100")
}

type fixedClock []time.Duration

func (f fixedClock) ClockOffsets() []time.Duration { return f }

func TestClockProbe(t *testing.T) {
	ok, detail := check(t, NewClockProbe(fixedClock(nil), 0), time.Second)
	assert.True(t, ok, detail)
	ok, detail = check(t, NewClockProbe(fixedClock{3 * time.Millisecond, -2 * time.Millisecond, 5 * time.Millisecond}, 0), time.Second)
	assert.True(t, ok, detail)
	ok, detail = check(t, NewClockProbe(fixedClock{2 * time.Second, 2100 * time.Millisecond, 5 * time.Millisecond}, 0), time.Second)
	assert.False(t, ok)
	assert.Contains(t, detail, "peers' clocks are 2s from ours (median of 3); more than 500ms: check NTP on this node")
}

// A default path of kubeadm's that is not on the host is named with the setting that replaces it and
// how to turn off what needs it.
func TestKubeadmDefaultMissing(t *testing.T) {
	dir := t.TempDir()
	there := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(there, []byte("x"), 0o600))
	assert.NoError(t, kubeadmDefault(there, "probes.apiserver.tls.ca", "probes.apiserver.enabled: false"))
	missing := filepath.Join(dir, "pki", "ca.crt")
	assert.EqualError(t, kubeadmDefault(missing, "probes.apiserver.tls.ca", "probes.apiserver.enabled: false"),
		"probes.apiserver.tls.ca defaults to "+missing+" (where kubeadm puts it), which is not on this host: set probes.apiserver.tls.ca, or probes.apiserver.enabled: false")

	// A plain http:// API server endpoint needs no CA, so kubeadm's is not looked for (the agents of
	// test/bench/agentidle, probing a local stub, exited at start for the want of it).
	_, err := NewAPIServerProbe("http://127.0.0.1:8080/livez", TLSFiles{}, "")
	assert.NoError(t, err)
}
