package bmc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/silent"
)

// secret is the simulator's password in these tests; secretScanner asserts it never shows up.
const secret = "Hunter2-never-log-me"

type rig struct {
	t    *testing.T
	sim  *bmcsim.Server
	logs *capture.Buffer
	ca   string
}

// newRig starts a simulated Redfish BMC over HTTPS and checks at the end that the password never
// reached the logs.
func newRig(t *testing.T, cfg bmcsim.Config) *rig {
	t.Helper()
	cfg.Username, cfg.Password = "admin", secret
	sim, err := bmcsim.Start(cfg)
	require.NoError(t, err)
	r := &rig{t: t, sim: sim, logs: &capture.Buffer{}}
	if pem := sim.CertPEM(); pem != nil {
		r.ca = filepath.Join(t.TempDir(), "ca.pem")
		require.NoError(t, os.WriteFile(r.ca, pem, 0o600))
	}
	t.Cleanup(func() {
		_ = sim.Close()
		assert.NotContains(t, r.logs.String(), secret, "the password reached the logs")
	})
	return r
}

// fast are options for a simulator with short delays.
func (r *rig) opts() Options {
	return Options{CAFile: r.ca, PollInterval: 20 * time.Millisecond, VerifyTimeout: 3 * time.Second,
		GracefulTimeout: 2 * time.Second, RetryBase: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
}

func (r *rig) controller(endpoint string, opts Options, password string) *Controller {
	r.t.Helper()
	ep, err := ParseEndpoint(endpoint)
	require.NoError(r.t, err)
	c, err := New(ep, NewCredentials("admin", password), opts)
	require.NoError(r.t, err)
	return c
}

func noSecret(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		assert.NotContains(t, err.Error(), secret)
		assert.NotContains(t, fmt.Sprintf("%+v %#v", err, err), secret)
	}
}

func TestRedfishPowerOperations(t *testing.T) {
	delays := bmcsim.SystemConfig{ID: "1", PowerOnDelay: 50 * time.Millisecond, ShutdownDelay: 100 * time.Millisecond,
		CycleOffDuration: 80 * time.Millisecond}
	tests := []struct {
		name         string
		system       bmcsim.SystemConfig
		do           func(*Controller, context.Context) (Result, error)
		wantRequests []string
		wantAfter    PowerState
		wantAlready  bool
		wantEvidence string
	}{
		{name: "graceful off", system: delays, do: (*Controller).PowerOff,
			wantRequests: []string{"GracefulShutdown"}, wantAfter: PowerOff, wantEvidence: "Off observed after GracefulShutdown"},
		{name: "off when already off is success, said so", system: bmcsim.SystemConfig{ID: "1", PowerState: "Off"}, do: (*Controller).PowerOff,
			wantAfter: PowerOff, wantAlready: true, wantEvidence: "already Off: nothing sent"},
		{name: "force off asks no OS", system: delays, do: (*Controller).ForceOff,
			wantRequests: []string{"ForceOff"}, wantAfter: PowerOff, wantEvidence: "Off observed after ForceOff"},
		{name: "force off when already off", system: bmcsim.SystemConfig{ID: "1", PowerState: "Off"}, do: (*Controller).ForceOff,
			wantAfter: PowerOff, wantAlready: true, wantEvidence: "already Off: nothing sent"},
		{name: "on", system: bmcsim.SystemConfig{ID: "1", PowerState: "Off", PowerOnDelay: 50 * time.Millisecond}, do: (*Controller).PowerOn,
			wantRequests: []string{"On"}, wantAfter: PowerOn, wantEvidence: "On observed after On"},
		{name: "on when already on", system: delays, do: (*Controller).PowerOn, wantAfter: PowerOn, wantAlready: true},
		{name: "cycle prefers PowerCycle", system: delays, do: (*Controller).PowerCycle,
			wantRequests: []string{"PowerCycle"}, wantAfter: PowerOn, wantEvidence: "Off then On observed after PowerCycle"},
		{name: "cycle falls back to ForceRestart, proven by LastResetTime",
			system: bmcsim.SystemConfig{ID: "1", ResetTypes: []string{"On", "ForceOff", "ForceRestart"}}, do: (*Controller).PowerCycle,
			wantRequests: []string{"ForceRestart"}, wantAfter: PowerOn, wantEvidence: "On, and LastResetTime moved"},
		{name: "cycle falls back to ForceOff then On",
			system: bmcsim.SystemConfig{ID: "1", ResetTypes: []string{"On", "ForceOff"}}, do: (*Controller).PowerCycle,
			wantRequests: []string{"ForceOff", "On"}, wantAfter: PowerOn, wantEvidence: "On observed after On"},
		{name: "cycle of a machine that is off powers it on", system: bmcsim.SystemConfig{ID: "1", PowerState: "Off"}, do: (*Controller).PowerCycle,
			wantRequests: []string{"On"}, wantAfter: PowerOn},
		{name: "reboot is graceful first", system: delays, do: (*Controller).Reboot,
			wantRequests: []string{"GracefulRestart"}, wantAfter: PowerOn, wantEvidence: "Off then On observed after GracefulRestart"},
		{name: "reboot without GracefulRestart is a hard cycle",
			system: bmcsim.SystemConfig{ID: "1", ResetTypes: []string{"On", "ForceOff", "PowerCycle"}}, do: (*Controller).Reboot,
			wantRequests: []string{"PowerCycle"}, wantAfter: PowerOn},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, bmcsim.Config{Systems: []bmcsim.SystemConfig{tt.system}})
			c := r.controller(r.sim.Endpoint(), r.opts(), secret)
			res, err := tt.do(c, context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.wantRequests, res.Requests)
			assert.Equal(t, tt.wantAfter, res.After)
			assert.Equal(t, string(tt.wantAfter), r.sim.PowerState("1"), "the simulator agrees")
			assert.Equal(t, tt.wantAlready, res.Already)
			assert.Contains(t, res.Evidence, tt.wantEvidence)
			assert.Equal(t, 0, r.sim.Sessions(), "every session is logged out")
		})
	}
}

func TestRedfishFaults(t *testing.T) {
	t.Run("wrong password: one login, ErrAuth, says check credentials", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		c := r.controller(r.sim.Endpoint(), r.opts(), "wrong-"+secret)
		before := r.sim.Requests()
		_, err := c.PowerOff(context.Background())
		require.ErrorIs(t, err, ErrAuth)
		assert.Contains(t, err.Error(), "check the credentials")
		assert.LessOrEqual(t, r.sim.Requests()-before, 2, "service root and one login: no retry loop")
		assert.Equal(t, "On", r.sim.PowerState("1"))
		noSecret(t, err)
	})
	t.Run("credentials revoked mid-way are not retried", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{RejectAuth: true})
		_, err := r.controller(r.sim.Endpoint(), r.opts(), secret).PowerState(context.Background())
		require.ErrorIs(t, err, ErrAuth)
	})
	t.Run("a session the BMC ends is logged in again, no refused login", func(t *testing.T) {
		// The BMC ends the session at the reset itself (as one past its session limit, or whose
		// manager resets, does): the reset is asked again in a new session and made once.
		var sim atomic.Pointer[bmcsim.Server]
		r := newRig(t, bmcsim.Config{OnRequest: func(req *http.Request) {
			if s := sim.Load(); s != nil && req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "ComputerSystem.Reset") {
				s.SetFaults(bmcsim.Faults{EndSessions: 1})
				sim.Store(nil) // once
			}
		}})
		sim.Store(r.sim)
		res, err := r.controller(r.sim.Endpoint(), r.opts(), secret).PowerCycle(context.Background())
		require.NoError(t, err)
		assert.Equal(t, PowerOn, res.After)
		assert.Len(t, r.sim.Resets("1"), 1, "the reset answered 401 was not made; made once in the new session")
		assert.Zero(t, r.sim.FailedLogins())
		assert.Zero(t, r.sim.Sessions(), "every session is logged out")
	})
	t.Run("a request refused again in a new session: refused, not the credentials", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{EndSessions: 2})
		_, err := r.controller(r.sim.Endpoint(), r.opts(), secret).PowerState(context.Background())
		require.ErrorIs(t, err, ErrRefused)
		assert.NotErrorIs(t, err, ErrAuth, "a login record would hold every machine of the account")
		assert.Contains(t, err.Error(), "list systems: HTTP 401 Unauthorized: Base.1.8.NoValidSession: authentication required (in a session opened just before: the account logs in")
		assert.Zero(t, r.sim.FailedLogins())
	})
	t.Run("500s are retried", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{Fail500: 3})
		st, err := r.controller(r.sim.Endpoint(), r.opts(), secret).PowerState(context.Background())
		require.NoError(t, err)
		assert.Equal(t, PowerOn, st)
		assert.Contains(t, r.logs.String(), "transient BMC failure; retrying")
	})
	t.Run("500s past the retries fail as refused", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{Fail500: 1000})
		_, err := r.controller(r.sim.Endpoint(), r.opts(), secret).PowerState(context.Background())
		require.ErrorIs(t, err, ErrRefused)
		assert.Contains(t, err.Error(), "500")
	})
	t.Run("malformed JSON is retried, not a panic", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{Malformed: 2})
		res, err := r.controller(r.sim.Endpoint(), r.opts(), secret).PowerOff(context.Background())
		require.NoError(t, err)
		assert.Equal(t, PowerOff, res.After)
	})
	t.Run("malformed JSON for good fails with an error", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{Malformed: 1000})
		_, err := r.controller(r.sim.Endpoint(), r.opts(), secret).PowerState(context.Background())
		require.ErrorIs(t, err, ErrRefused)
	})
	t.Run("a BMC that accepts a reset but never acts: could not verify", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{IgnoreResets: true})
		opts := r.opts()
		opts.VerifyTimeout, opts.GracefulTimeout = 300*time.Millisecond, 200*time.Millisecond
		res, err := r.controller(r.sim.Endpoint(), opts, secret).PowerOff(context.Background())
		require.ErrorIs(t, err, ErrUnverified)
		assert.Contains(t, err.Error(), "the BMC accepted ForceOff but reports On after 300ms")
		assert.Equal(t, []string{"GracefulShutdown", "ForceOff"}, res.Requests, "graceful first, then forced")
		assert.Equal(t, []string{"GracefulShutdown (ignored)", "ForceOff (ignored)"}, r.sim.Resets("1"))
	})
	t.Run("reboot unproven: graceful, then hard, then could not verify", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{IgnoreResets: true})
		opts := r.opts()
		opts.VerifyTimeout, opts.GracefulTimeout = 200*time.Millisecond, 200*time.Millisecond
		res, err := r.controller(r.sim.Endpoint(), opts, secret).Reboot(context.Background())
		require.ErrorIs(t, err, ErrUnverified)
		assert.Equal(t, []string{"GracefulRestart", "PowerCycle"}, res.Requests)
	})
	t.Run("slow answers within the deadline still work", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{Latency: 30 * time.Millisecond})
		_, err := r.controller(r.sim.Endpoint(), r.opts(), secret).PowerState(context.Background())
		require.NoError(t, err)
	})
	t.Run("slow answers past the caller's deadline stop, not retried", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{Latency: 2 * time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := r.controller(r.sim.Endpoint(), r.opts(), secret).PowerState(ctx)
		require.Error(t, err)
		assert.Less(t, time.Since(start), 1500*time.Millisecond)
	})
	t.Run("wrong password, basic auth only: one failed login, ErrAuth, not retried", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{Systems: []bmcsim.SystemConfig{{ID: "1"}, {ID: "2"}}})
		r.sim.SetFaults(bmcsim.Faults{NoSessionService: true})
		for _, ep := range []string{r.sim.Endpoint() + "/systems/1", r.sim.Endpoint()} {
			before := r.sim.FailedLogins()
			_, err := r.controller(ep, r.opts(), "wrong-"+secret).PowerCycle(context.Background())
			require.ErrorIs(t, err, ErrAuth, ep)
			assert.Contains(t, err.Error(), "check the credentials")
			assert.Equal(t, 1, r.sim.FailedLogins()-before, "%s: one failed login per command (real BMCs lock the account after a few)", ep)
			noSecret(t, err)
		}
	})
	t.Run("HTTPS to a plain-HTTP BMC: a configuration error, not retried", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{PlainHTTP: true})
		ep := strings.Replace(r.sim.Endpoint(), "redfish+http://", "redfish://", 1)
		start := time.Now()
		_, err := r.controller(ep, r.opts(), secret).PowerState(context.Background())
		require.ErrorIs(t, err, ErrRefused)
		assert.Contains(t, err.Error(), "the BMC answers plain HTTP on this port")
		assert.NotContains(t, r.logs.String(), "retrying")
		assert.Less(t, time.Since(start), time.Second)
	})
	t.Run("no session service: basic auth", func(t *testing.T) {
		r := newRig(t, bmcsim.Config{})
		r.sim.SetFaults(bmcsim.Faults{NoSessionService: true})
		res, err := r.controller(r.sim.Endpoint(), r.opts(), secret).PowerCycle(context.Background())
		require.NoError(t, err)
		assert.Equal(t, PowerOn, res.After)
	})
}

func TestRedfishTLSAndSystems(t *testing.T) {
	r := newRig(t, bmcsim.Config{Systems: []bmcsim.SystemConfig{{ID: "a"}, {ID: "b", PowerState: "Off"}}})
	ctx := context.Background()

	noCA := r.opts()
	noCA.CAFile = ""
	_, err := r.controller(r.sim.Endpoint()+"/systems/a", noCA, secret).PowerState(ctx)
	require.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), "the inventory's caFile")
	assert.Contains(t, err.Error(), "--ca-file")

	insecure := noCA
	insecure.Insecure = true
	st, err := r.controller(r.sim.Endpoint()+"/systems/b", insecure, secret).PowerState(ctx)
	require.NoError(t, err)
	assert.Equal(t, PowerOff, st)

	st, err = r.controller(r.sim.Endpoint()+"/redfish/v1/Systems/a", r.opts(), secret).PowerState(ctx)
	require.NoError(t, err)
	assert.Equal(t, PowerOn, st)

	_, err = r.controller(r.sim.Endpoint(), r.opts(), secret).PowerState(ctx)
	require.EqualError(t, err, fmt.Sprintf("%s status: %v: the BMC has 2 systems (a, b): name one in the endpoint as /systems/ID",
		strings.TrimPrefix(r.sim.Endpoint(), ""), ErrRefused))

	_, err = r.controller(r.sim.Endpoint()+"/systems/zz", r.opts(), secret).PowerState(ctx)
	require.ErrorContains(t, err, `no system "zz"; the BMC has 2 systems (a, b)`)
}

func TestRedfishPlainHTTPAndMetrics(t *testing.T) {
	r := newRig(t, bmcsim.Config{PlainHTTP: true})
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	opts := r.opts()
	opts.Metrics = m
	c := r.controller(r.sim.Endpoint(), opts, secret)
	_, err = c.PowerCycle(context.Background())
	require.NoError(t, err)
	bad := r.controller(r.sim.Endpoint(), opts, "nope")
	_, err = bad.PowerState(context.Background())
	require.ErrorIs(t, err, ErrAuth)

	assert.InDelta(t, 1, testutil.ToFloat64(m.calls.WithLabelValues("redfish", "cycle", "ok")), 0)
	assert.InDelta(t, 1, testutil.ToFloat64(m.calls.WithLabelValues("redfish", "status", "auth")), 0)
	out, err := testutil.CollectAndLint(m.duration)
	require.NoError(t, err)
	assert.Empty(t, out)
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		assert.NotContains(t, f.String(), secret)
	}
}

// TestRedfishOwnRefusalsAreNotRetried: the driver's own refusals of a BMC's shape (no Systems link,
// a collection whose next link never ends) are configuration problems: one try, no backoff.
func TestRedfishOwnRefusalsAreNotRetried(t *testing.T) {
	loop := `{"Members":[],"Members@odata.nextLink":"/redfish/v1/Systems"}`
	for _, tc := range []struct {
		name, root, coll, want string
	}{
		{"no Systems link", `{"@odata.id":"/redfish/v1/","Id":"RootService"}`, fuzzCollection, "the service root has no Systems link"},
		{"next link loops", fuzzRoot, loop, "more than 16 pages of members"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fuzzBMC{}
			b.set([]byte(tc.root), []byte(tc.coll), []byte(fuzzSystem))
			srv := httptest.NewServer(b)
			t.Cleanup(srv.Close)
			logs := &capture.Buffer{}
			ep, err := ParseEndpoint("redfish+http://" + strings.TrimPrefix(srv.URL, "http://"))
			require.NoError(t, err)
			c, err := New(ep, NewCredentials("u", "p"), Options{RetryBase: time.Millisecond, RetryMax: 2 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			require.NoError(t, err)
			_, err = c.PowerState(context.Background())
			require.ErrorIs(t, err, ErrRefused)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, logs.String(), "retrying", "a refusal is not retried")
		})
	}
}

// WithCheck: a disruptive request is sent only if the caller's check, made just before it goes out,
// still allows it; powering on is never withheld.
func TestRedfishCheckWithdrawsDisruptiveRequests(t *testing.T) {
	recovered := errors.New("cp-1 is Healthy again")
	tests := []struct {
		name         string
		system       bmcsim.SystemConfig
		faults       bmcsim.Faults
		allow        int // how many checks pass before the check refuses
		do           func(*Controller, context.Context) (Result, error)
		wantResets   []string
		wantWithdraw bool
		wantPower    string
	}{
		{name: "reboot withdrawn: nothing sent", system: bmcsim.SystemConfig{ID: "1"}, do: (*Controller).Reboot,
			wantWithdraw: true, wantPower: "On"},
		{name: "force off withdrawn", system: bmcsim.SystemConfig{ID: "1"}, do: (*Controller).ForceOff,
			wantWithdraw: true, wantPower: "On"},
		{name: "allowed: sent", system: bmcsim.SystemConfig{ID: "1"}, allow: 1000, do: (*Controller).PowerCycle,
			wantResets: []string{"PowerCycle"}, wantPower: "On"},
		{name: "powering on is never withheld", system: bmcsim.SystemConfig{ID: "1", PowerState: "Off"}, do: (*Controller).Reboot,
			wantResets: []string{"On"}, wantPower: "On"},
		{name: "checked again before the hard cycle after an unproven graceful restart",
			system: bmcsim.SystemConfig{ID: "1"}, faults: bmcsim.Faults{IgnoreResets: true}, allow: 1, do: (*Controller).Reboot,
			wantResets: []string{"GracefulRestart (ignored)"}, wantWithdraw: true, wantPower: "On"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, bmcsim.Config{Systems: []bmcsim.SystemConfig{tt.system}})
			r.sim.SetFaults(tt.faults)
			opts := r.opts()
			opts.GracefulTimeout = 300 * time.Millisecond
			c := r.controller(r.sim.Endpoint(), opts, secret)
			checks := 0
			ctx := WithCheck(context.Background(), func(context.Context) error {
				checks++
				if checks > tt.allow {
					return recovered
				}
				return nil
			})
			_, err := tt.do(c, ctx)
			assert.Equal(t, tt.wantResets, r.sim.Resets("1"), "what reached the BMC")
			assert.Equal(t, tt.wantPower, r.sim.PowerState("1"))
			if !tt.wantWithdraw {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrWithdrawn)
			require.ErrorIs(t, err, recovered)
			assert.NotErrorIs(t, err, ErrRefused)
			assert.Contains(t, err.Error(), r.sim.Endpoint())
			assert.Equal(t, tt.allow+1, checks, "a withdrawn request is not retried")
		})
	}
}

// A readiness check's question, "can Hale reach and log in to this BMC?", answered in one word and one
// line that names the BMC: a silent port within the request timeout, a closed one at once, the
// password, the system; a BMC's error body is reduced to its status, message ID and message.
func TestRedfishProblems(t *testing.T) {
	r := newRig(t, bmcsim.Config{})
	silent := silent.Listen(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	require.NoError(t, closed.Close())
	opts := r.opts()
	opts.Retries, opts.RequestTimeout = -1, 300*time.Millisecond
	tests := []struct {
		name, endpoint, password string
		want                     Problem
		says                     string
	}{
		{"ready", r.sim.Endpoint(), secret, ProblemNone, ""},
		{"wrong password", r.sim.Endpoint(), "wrong-" + secret, ProblemLogin, "HTTP 401 Unauthorized"},
		{"silent port", "redfish://" + silent.Addr(), secret, ProblemUnreachable, "BMC unreachable: connect: no answer within 300ms; check the address"},
		{"closed port", "redfish://" + closedAddr, secret, ProblemUnreachable, "BMC unreachable: connect: cannot connect: "},
		{"no such system", r.sim.Endpoint() + "/systems/zz", secret, ProblemNoSystem, `no system "zz"; the BMC has one system (1)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, err := r.controller(tt.endpoint, opts, tt.password).PowerState(context.Background())
			assert.Equal(t, tt.want, ProblemOf(err), "%v", err)
			t.Logf("%s: %v", ProblemOf(err), err)
			assert.Less(t, time.Since(start), 3*time.Second)
			if tt.want == ProblemNone {
				return
			}
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), tt.endpoint+" status: "), err.Error())
			assert.Contains(t, err.Error(), tt.says)
			assert.NotContains(t, err.Error(), "\n", "one line")
			assert.NotContains(t, err.Error(), "{", "no JSON body")
			assert.True(t, errors.Is(err, ErrRefused) || errors.Is(err, ErrAuth), "exit code 2 for `hub bmc power`")
			noSecret(t, err)
		})
	}
}

// A silent Redfish BMC costs one request timeout per attempt: no answer is not "no session service",
// so it is not asked again with basic auth (each attempt asked twice: `hub check` of a silent BMC took
// four request timeouts, not the two its one retry allows).
func TestRedfishSilentBMCOneConnectionPerAttempt(t *testing.T) {
	silent := silent.Listen(t)
	r := newRig(t, bmcsim.Config{})
	opts := r.opts()
	opts.Retries, opts.RequestTimeout, opts.RetryBase = 1, 200*time.Millisecond, 10*time.Millisecond
	_, err := r.controller("redfish+http://"+silent.Addr(), opts, secret).PowerState(context.Background())
	assert.Equal(t, ProblemUnreachable, ProblemOf(err), "%v", err)
	assert.Equal(t, 2, silent.Accepted(), "connections: one per attempt (one retry)")
}
