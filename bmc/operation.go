package bmc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// already reports whether the machine is in state st before anything was sent, and says so.
func (op *operation) already(st PowerState) bool {
	if op.res.Before != st {
		return false
	}
	op.res.Already = true
	op.res.Evidence = fmt.Sprintf("already %s: nothing sent", st)
	return true
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
