package bmc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/hale-dev/hale/config"
)

// PowerState is a machine's power state as its BMC reports it.
type PowerState string

// Power states (Redfish's names; IPMI maps onto On and Off).
const (
	PowerOn         PowerState = "On"
	PowerOff        PowerState = "Off"
	PowerPoweringOn PowerState = "PoweringOn"
	// PowerPoweringOff is a transient state on the way to Off.
	PowerPoweringOff PowerState = "PoweringOff"
	PowerUnknown     PowerState = "Unknown"
)

// Errors, for errors.Is. Each returned error wraps one of them and says what to do.
var (
	// ErrAuth: the BMC rejected the credentials. Never retried: BMC accounts lock out.
	ErrAuth = errors.New("authentication failed")
	// ErrRefused: the BMC answered but refused or failed the request, or kept failing until the retries ran out.
	ErrRefused = errors.New("BMC refused or failed the request")
	// ErrUnverified: the BMC accepted the request, but the expected state was not observed before the deadline.
	ErrUnverified = errors.New("could not verify")
	// ErrWithdrawn: the caller's check (WithCheck) withdrew a disruptive request just before it would
	// have been sent: nothing was sent for it.
	ErrWithdrawn = errors.New("withdrawn before it was sent")
	// ErrUnreachable: the BMC did not answer (no connection, or no answer within the request
	// timeout). An error that wraps it wraps ErrRefused too.
	ErrUnreachable = errors.New("BMC unreachable")
	// ErrNoSystem: the BMC answered but has no system the endpoint names. It wraps ErrRefused too.
	ErrNoSystem = errors.New("no such system")
)

// Problem is what a failed call says is wrong with a BMC, for a readiness check: the operator's
// first question ("can Hale reach and log in to this BMC?") in one word.
type Problem string

// Problems, from the outside in.
const (
	ProblemNone        Problem = ""
	ProblemUnreachable Problem = "Unreachable"  // no answer: the address, the port, the network path, the BMC itself
	ProblemLogin       Problem = "LoginRefused" // the credentials (or the account, locked or without the privilege)
	ProblemNoSystem    Problem = "NoSuchSystem" // the endpoint's /systems/ID
	ProblemAnswer      Problem = "BadAnswer"    // it answered, but refused or failed the request
)

// ProblemOf says what err, from a Controller's call, says is wrong.
func ProblemOf(err error) Problem {
	switch {
	case err == nil:
		return ProblemNone
	case errors.Is(err, ErrAuth):
		return ProblemLogin
	case errors.Is(err, ErrUnreachable):
		return ProblemUnreachable
	case errors.Is(err, ErrNoSystem):
		return ProblemNoSystem
	}
	return ProblemAnswer
}

type checkKey struct{}

type retriesKey struct{}

// WithRetries returns a context under which a Controller retries a transient failure at most n times
// (fewer than its Options say, never more): a readiness check that must not hold a BMC account long.
func WithRetries(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, retriesKey{}, max(n, 0))
}

// retries is how many times a transient failure is retried under ctx.
func (c *Controller) retries(ctx context.Context) int {
	if n, ok := ctx.Value(retriesKey{}).(int); ok {
		return min(n, c.opts.Retries)
	}
	return c.opts.Retries
}

// WithCheck returns a context under which every disruptive request of an operation (a restart, a
// power cycle, a power off; each retry too) is sent only if check, called just before it, returns
// nil. Otherwise the operation ends at once with ErrWithdrawn and check's error. Powering on is never
// withheld. What made a request wanted can pass while it waits for the BMC (a BMC unreachable for
// seconds, retried; a graceful restart given minutes before the hard cycle): the check is made when
// the request goes out, not when the operation began.
func WithCheck(ctx context.Context, check func(context.Context) error) context.Context {
	return context.WithValue(ctx, checkKey{}, check)
}

// disruptive says whether a takes a running machine down.
func (a action) disruptive() bool { return a != actOn }

// Result is what a state-changing call did and what it observed.
type Result struct {
	Endpoint  string     `json:"endpoint"`
	Operation string     `json:"operation"`
	Before    PowerState `json:"before"`
	After     PowerState `json:"after"`
	// Already says nothing was sent: the machine was already in the requested state.
	Already bool `json:"already"`
	// Requests lists what was sent, in order (Redfish reset types, IPMI chassis commands).
	Requests []string `json:"requests"`
	// Evidence says how the change was verified.
	Evidence   string    `json:"evidence"`
	Started    time.Time `json:"started"`
	ObservedAt time.Time `json:"observedAt"`
	// Duration is how long it took ("1.234s" in JSON).
	Duration config.Duration `json:"duration"`
}

// action is one raw request a driver can send.
type action string

const (
	actOn              action = "On"
	actGracefulOff     action = "GracefulShutdown"
	actForceOff        action = "ForceOff"
	actPowerCycle      action = "PowerCycle"
	actForceRestart    action = "ForceRestart"
	actGracefulRestart action = "GracefulRestart"
)

// errClass says how a driver error is handled.
type errClass int

const (
	classTransient errClass = iota // timeouts, 5xx, connection refused: retried with backoff
	classAuth                      // never retried
	classRefused                   // the BMC said no: not retried
)

// classified is a driver error with its class.
type classified struct {
	class errClass
	err   error
}

func (c *classified) Error() string { return c.err.Error() }
func (c *classified) Unwrap() error { return c.err }

func transient(err error) error { return &classified{classTransient, err} }
func refused(err error) error   { return &classified{classRefused, err} }

// errDriverPanic marks a panic of a driver library, recovered: the daemon lives on, and the fuzz
// targets fail on it (it is a bug to fix, in the driver or in what we hand it).
var errDriverPanic = errors.New("the BMC driver failed on the BMC's answer")

func authFailed(err error) error {
	return &classified{classAuth, err}
}

func classOf(err error) errClass {
	var c *classified
	if errors.As(err, &c) {
		return c.class
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return classRefused // the caller's deadline: stop, do not retry
	}
	return classTransient
}

// driver opens one conversation with a BMC; a conn is used for one operation and closed.
type driver interface {
	name() string
	open(ctx context.Context) (conn, error)
}

// conn is one open conversation with a BMC.
type conn interface {
	// state reads the power state and, when the BMC reports it, the time of the last reset.
	state(ctx context.Context) (PowerState, time.Time, error)
	supports(a action) bool
	// do sends a and returns the name of what was sent.
	do(ctx context.Context, a action) (string, error)
	close()
}

// Options tune a Controller. Zero values take the defaults.
type Options struct {
	// VerifyTimeout bounds how long a change may take to be observed (default 60 s).
	VerifyTimeout time.Duration
	// GracefulTimeout bounds a graceful shutdown or restart before Hale forces it (default 120 s).
	GracefulTimeout time.Duration
	// PollInterval is the time between power-state reads while verifying (default 500 ms).
	PollInterval time.Duration
	// RequestTimeout bounds one request to a Redfish BMC, its answer's body included, and one ipmitool
	// call (default 10 s; an answering BMC takes well under a second).
	RequestTimeout time.Duration
	// Retries is how many times a transient failure is retried (default 4, negative for none); RetryBase and RetryMax
	// bound the exponential backoff with jitter (defaults 250 ms and 5 s).
	Retries   int
	RetryBase time.Duration
	RetryMax  time.Duration
	// CAFile is a PEM bundle to verify a Redfish BMC's certificate with; Insecure skips verification
	// (only when asked for explicitly).
	CAFile   string
	Insecure bool
	// IPMICipherSuite is ipmitool's -C (default 3: without it ipmitool probes suites for ~10 s a call).
	IPMICipherSuite string
	// IPMIToolPath is the ipmitool binary (default: ipmitool on PATH).
	IPMIToolPath string
	Logger       *slog.Logger
	Metrics      *Metrics
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.VerifyTimeout, 60*time.Second)
	def(&o.GracefulTimeout, 120*time.Second)
	def(&o.PollInterval, 500*time.Millisecond)
	def(&o.RequestTimeout, 10*time.Second)
	def(&o.RetryBase, 250*time.Millisecond)
	def(&o.RetryMax, 5*time.Second)
	switch {
	case o.Retries == 0:
		o.Retries = 4
	case o.Retries < 0:
		o.Retries = 0
	}
	if o.IPMICipherSuite == "" {
		o.IPMICipherSuite = "3"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// LongestOperation is how long one state-changing call may take with these options, requests that
// hang aside: a graceful restart given up after GracefulTimeout, then a power cycle whose off and on
// are each verified for up to VerifyTimeout, and a minute for the requests and retries between.
func (o Options) LongestOperation() time.Duration {
	o = o.withDefaults()
	return o.GracefulTimeout + 2*o.VerifyTimeout + time.Minute
}

// deadlineRanOut is the error of a request cut short by the caller's deadline rather than by its own
// (a command's --timeout, a step's bound): said so, not as "no answer within" the request timeout.
func deadlineRanOut(ctx context.Context, what string) error {
	return &marked{[]error{ErrUnreachable, ctx.Err()}, what + ": no answer before the operation's deadline ran out (its overall timeout, " +
		"shorter than the BMC's request timeout allowed)"}
}

// Controller controls one BMC: every change is verified by polling, transient failures are retried,
// authentication failures are not.
type Controller struct {
	ep   Endpoint
	drv  driver
	opts Options
	log  *slog.Logger
}

// New returns a Controller for ep. It does not contact the BMC; it fails when the driver cannot work
// at all (ipmitool missing, an unreadable CA bundle).
func New(ep Endpoint, creds Credentials, opts Options) (*Controller, error) {
	opts = opts.withDefaults()
	var drv driver
	var err error
	switch ep.Driver {
	case DriverRedfish:
		drv, err = newRedfishDriver(ep, creds, opts)
	case DriverIPMI:
		drv, err = newIPMIDriver(ep, creds, opts)
	default:
		err = fmt.Errorf("BMC endpoint %s: unknown driver %q", ep, ep.Driver)
	}
	if err != nil {
		return nil, err
	}
	return &Controller{ep: ep, drv: drv, opts: opts, log: opts.Logger.With("bmc", ep.String(), "driver", drv.name())}, nil
}

// Endpoint returns the controller's endpoint.
func (c *Controller) Endpoint() Endpoint { return c.ep }

// PowerState reads the power state.
func (c *Controller) PowerState(ctx context.Context) (PowerState, error) {
	st, _, err := c.Status(ctx)
	return st, err
}

// Status reads the power state and, when the BMC reports it, when the system last came out of a reset
// (zero otherwise): what a restarted hub reads to learn whether a power action it intended happened.
func (c *Controller) Status(ctx context.Context) (PowerState, time.Time, error) {
	var st PowerState
	var lastReset time.Time
	err := c.session(ctx, "status", func(cn conn) error {
		var err error
		st, lastReset, err = c.read(ctx, cn)
		return err
	})
	return st, lastReset, err
}

// PowerOn powers the machine on and waits until the BMC reports On.
func (c *Controller) PowerOn(ctx context.Context) (Result, error) {
	return c.operate(ctx, "on", func(op *operation) error {
		if op.already(PowerOn) {
			return nil
		}
		return op.sendAndWait(actOn, PowerOn, c.opts.VerifyTimeout)
	})
}

// PowerOff shuts the machine down gracefully, forces it off if it is still on after GracefulTimeout,
// and waits until the BMC reports Off.
func (c *Controller) PowerOff(ctx context.Context) (Result, error) {
	return c.operate(ctx, "off", func(op *operation) error {
		if op.already(PowerOff) {
			return nil
		}
		if op.cn.supports(actGracefulOff) {
			err := op.sendAndWait(actGracefulOff, PowerOff, c.opts.GracefulTimeout)
			if !errors.Is(err, ErrUnverified) {
				return err
			}
			c.log.Warn("graceful shutdown did not finish in time; forcing off", "after", c.opts.GracefulTimeout)
		}
		return op.sendAndWait(actForceOff, PowerOff, c.opts.VerifyTimeout)
	})
}

// already reports whether the machine is in state st before anything was sent, and says so.
func (op *operation) already(st PowerState) bool {
	if op.res.Before != st {
		return false
	}
	op.res.Already = true
	op.res.Evidence = fmt.Sprintf("already %s: nothing sent", st)
	return true
}

// ForceOff powers the machine off at once, without asking its OS (a fence: the machine may be hung or
// must not touch shared state again), and returns when the BMC reports Off.
func (c *Controller) ForceOff(ctx context.Context) (Result, error) {
	return c.operate(ctx, "force-off", func(op *operation) error {
		if op.already(PowerOff) {
			return nil
		}
		return op.sendAndWait(actForceOff, PowerOff, c.opts.VerifyTimeout)
	})
}

// PowerCycle power-cycles the machine hard: PowerCycle, else ForceRestart, else ForceOff then On, as
// the BMC allows. A machine that is off is powered on. It returns when the BMC reports On again and
// the reset is proven (Off observed on the way, or the BMC's LastResetTime moved).
func (c *Controller) PowerCycle(ctx context.Context) (Result, error) {
	return c.operate(ctx, "cycle", func(op *operation) error { return op.hardCycle() })
}

// Reboot restarts the machine gracefully and falls back to a hard power cycle when the graceful
// restart is not supported or not proven within GracefulTimeout. A machine that is off is powered on.
func (c *Controller) Reboot(ctx context.Context) (Result, error) {
	return c.operate(ctx, "reboot", func(op *operation) error {
		if op.res.Before != PowerOff && op.cn.supports(actGracefulRestart) {
			err := op.sendAndProveReset(actGracefulRestart, c.opts.GracefulTimeout)
			if !errors.Is(err, ErrUnverified) {
				return err
			}
			c.log.Warn("graceful restart not observed in time; power-cycling", "after", c.opts.GracefulTimeout)
		}
		return op.hardCycle()
	})
}

// operation is one state-changing call in progress.
type operation struct {
	c   *Controller
	ctx context.Context
	cn  conn
	res *Result
	// lastReset is the BMC's LastResetTime when the operation started (zero when not reported).
	lastReset time.Time
}

func (c *Controller) operate(ctx context.Context, name string, body func(*operation) error) (Result, error) {
	res := Result{Endpoint: c.ep.String(), Operation: name, Started: time.Now()}
	err := c.session(ctx, name, func(cn conn) error {
		op := &operation{c: c, ctx: ctx, cn: cn, res: &res}
		st, lr, err := c.read(ctx, cn)
		if err != nil {
			return err
		}
		res.Before, res.After, op.lastReset = st, st, lr
		res.ObservedAt = time.Now()
		return body(op)
	})
	res.Duration.Duration = time.Since(res.Started)
	if err == nil {
		c.log.Info("power "+name+" done", "before", res.Before, "after", res.After, "requests", res.Requests,
			"evidence", res.Evidence, "took", res.Duration.Round(time.Millisecond))
	}
	return res, err
}

// session opens a conn, runs f, records metrics, and turns the error into one that names the endpoint
// and says what to do.
func (c *Controller) session(ctx context.Context, call string, f func(conn) error) (err error) {
	start := time.Now()
	defer func() {
		// A driver library choking on a BMC's answer must not take the daemon down.
		if r := recover(); r != nil {
			err = c.explain(call, refused(fmt.Errorf("%w: %v", errDriverPanic, r)))
			c.opts.Metrics.observe(c.drv.name(), call, err, time.Since(start))
		}
	}()
	cn, err := retry(ctx, c, "connect", func() (conn, error) { return c.drv.open(ctx) })
	if err == nil {
		defer cn.close()
		err = f(cn)
	}
	err = c.explain(call, err)
	c.opts.Metrics.observe(c.drv.name(), call, err, time.Since(start))
	return err
}

func (c *Controller) explain(call string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrUnverified), errors.Is(err, ErrWithdrawn):
		return fmt.Errorf("%s %s: %w", c.ep, call, err)
	case classOf(err) == classAuth:
		return fmt.Errorf("%s %s: %w: %v; check the credentials (not retried: BMC accounts lock out)", c.ep, call, ErrAuth, err)
	case errors.Is(err, ErrUnreachable):
		return &marked{[]error{ErrRefused, ErrUnreachable}, fmt.Sprintf("%s %s: %s: %s; check the address, the port and the network path to the BMC",
			c.ep, call, ErrUnreachable, cause(err))}
	case errors.Is(err, ErrNoSystem):
		return &marked{[]error{ErrRefused, ErrNoSystem}, fmt.Sprintf("%s %s: %s", c.ep, call, cause(err))}
	}
	return fmt.Errorf("%s %s: %w: %v", c.ep, call, ErrRefused, err)
}

// marked is an error that is its sentinels for errors.Is (ErrUnreachable, ErrNoSystem, ErrRefused)
// and says only its detail: no sentinel's words said twice, none that would mislead ("refused" for a
// BMC that never answered).
type marked struct {
	marks  []error
	detail string
}

func (m *marked) Error() string   { return m.detail }
func (m *marked) Unwrap() []error { return m.marks }

// cause is err's text without the sentinel's words in front (what follows "BMC unreachable: ").
func cause(err error) string {
	var m *marked
	if errors.As(err, &m) {
		return m.detail
	}
	return err.Error()
}

// read reads the power state with retries.
func (c *Controller) read(ctx context.Context, cn conn) (PowerState, time.Time, error) {
	type reading struct {
		st PowerState
		lr time.Time
	}
	r, err := retry(ctx, c, "read power state", func() (reading, error) {
		st, lr, err := cn.state(ctx)
		return reading{st, lr}, err
	})
	return r.st, r.lr, err
}

// send sends a, retrying transient failures only while the BMC shows no sign of having acted on it.
func (op *operation) send(a action) error {
	before, beforeReset := op.res.After, op.lastReset
	check, _ := op.ctx.Value(checkKey{}).(func(context.Context) error)
	attempt := 0
	for {
		if check != nil && a.disruptive() {
			if err := check(op.ctx); err != nil {
				return refused(fmt.Errorf("%s %w: %w", a, ErrWithdrawn, err))
			}
		}
		method, err := op.cn.do(op.ctx, a)
		if err == nil {
			op.res.Requests = append(op.res.Requests, method)
			return nil
		}
		attempt++
		if classOf(err) != classTransient || attempt > op.c.retries(op.ctx) {
			return err
		}
		// The request may have been carried out even though the answer was lost: look before resending.
		if st, lr, rerr := op.cn.state(op.ctx); rerr == nil && (st != before || lr.After(beforeReset)) {
			op.c.log.Warn("request failed but the BMC shows it took effect; not resending", "request", a, "err", err, "state", st)
			op.res.Requests = append(op.res.Requests, string(a)+" (answer lost)")
			return nil
		}
		if werr := op.c.backoff(op.ctx, attempt, "send "+string(a), err); werr != nil {
			return err
		}
	}
}

// sendAndWait sends a and polls until the BMC reports want, for at most timeout.
func (op *operation) sendAndWait(a action, want PowerState, timeout time.Duration) error {
	if err := op.send(a); err != nil {
		return err
	}
	return op.waitFor(timeout, string(a), func(st PowerState, _ time.Time, _ bool) (bool, string) {
		return st == want, fmt.Sprintf("%s observed after %s", want, a)
	})
}

// sendAndProveReset sends a restart or cycle and polls until the BMC reports On and the reset is
// proven: a non-On state was observed on the way, or LastResetTime moved past its starting value.
func (op *operation) sendAndProveReset(a action, timeout time.Duration) error {
	if err := op.send(a); err != nil {
		return err
	}
	return op.waitFor(timeout, string(a), func(st PowerState, lr time.Time, sawOff bool) (bool, string) {
		switch {
		case st != PowerOn:
			return false, ""
		case sawOff:
			return true, fmt.Sprintf("Off then On observed after %s", a)
		case lr.After(op.lastReset):
			return true, fmt.Sprintf("On, and LastResetTime moved to %s after %s", lr.Format(time.RFC3339Nano), a)
		}
		return false, ""
	})
}

// hardCycle is PowerCycle, else ForceRestart, else ForceOff then On; On for a machine that is off.
func (op *operation) hardCycle() error {
	switch {
	case op.res.After == PowerOff:
		return op.sendAndWait(actOn, PowerOn, op.c.opts.VerifyTimeout)
	case op.cn.supports(actPowerCycle):
		return op.sendAndProveReset(actPowerCycle, op.c.opts.VerifyTimeout)
	case op.cn.supports(actForceRestart):
		return op.sendAndProveReset(actForceRestart, op.c.opts.VerifyTimeout)
	}
	if err := op.sendAndWait(actForceOff, PowerOff, op.c.opts.VerifyTimeout); err != nil {
		return err
	}
	return op.sendAndWait(actOn, PowerOn, op.c.opts.VerifyTimeout)
}

// waitFor polls the power state until done says so or timeout passes (ErrUnverified).
func (op *operation) waitFor(timeout time.Duration, what string, done func(PowerState, time.Time, bool) (bool, string)) error {
	deadline := time.Now().Add(timeout)
	sawOff := false
	for {
		st, lr, err := op.c.read(op.ctx, op.cn)
		if err != nil {
			return err
		}
		op.res.After, op.res.ObservedAt = st, time.Now()
		sawOff = sawOff || st == PowerOff || st == PowerPoweringOff || st == PowerPoweringOn
		if ok, evidence := done(st, lr, sawOff); ok {
			op.res.Evidence = evidence
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w: the BMC accepted %s but reports %s after %v", ErrUnverified, what, st, timeout.Round(time.Millisecond))
		}
		select {
		case <-op.ctx.Done():
			return fmt.Errorf("%w: %v while waiting after %s (the BMC reports %s)", ErrUnverified, op.ctx.Err(), what, st)
		case <-time.After(min(op.c.opts.PollInterval, time.Until(deadline))):
		}
	}
}

// retry runs f, retrying transient failures with capped exponential backoff and jitter. It never
// retries authentication failures or refusals.
func retry[T any](ctx context.Context, c *Controller, what string, f func() (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := f()
		if err == nil || classOf(err) != classTransient || attempt > c.retries(ctx) {
			return v, err
		}
		if werr := c.backoff(ctx, attempt, what, err); werr != nil {
			return v, err
		}
	}
}

// backoff sleeps before retry number attempt: RetryBase·2^(attempt−1), capped at RetryMax, times a
// random factor in [0.5, 1). It returns early with an error when ctx ends.
func (c *Controller) backoff(ctx context.Context, attempt int, what string, cause error) error {
	d := c.opts.RetryBase << min(attempt-1, 20)
	d = min(d, c.opts.RetryMax)
	d = time.Duration(float64(d) * (0.5 + rand.Float64()/2))
	c.log.Warn("transient BMC failure; retrying", "what", what, "attempt", attempt, "in", d.Round(time.Millisecond), "err", cause)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// parsePowerState maps a BMC's words onto a PowerState.
func parsePowerState(s string) PowerState {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "on":
		return PowerOn
	case "off":
		return PowerOff
	case "poweringon":
		return PowerPoweringOn
	case "poweringoff":
		return PowerPoweringOff
	}
	return PowerUnknown
}
