package bmc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/config"
)

// PowerState is a machine's power state as its BMC reports it (bmcval.PowerState).
type PowerState = bmcval.PowerState

// Power states.
const (
	PowerOn          = bmcval.PowerOn
	PowerOff         = bmcval.PowerOff
	PowerPoweringOn  = bmcval.PowerPoweringOn
	PowerPoweringOff = bmcval.PowerPoweringOff
	PowerUnknown     = bmcval.PowerUnknown
)

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
