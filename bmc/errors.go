package bmc

import (
	"context"
	"errors"
	"fmt"

	"github.com/hale-dev/hale/bmc/bmcval"
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

// Problem is what a failed call says is wrong with a BMC (bmcval.Problem).
type Problem = bmcval.Problem

// Problems, from the outside in.
const (
	ProblemNone        = bmcval.ProblemNone
	ProblemUnreachable = bmcval.ProblemUnreachable
	ProblemLogin       = bmcval.ProblemLogin
	ProblemNoSystem    = bmcval.ProblemNoSystem
	ProblemAnswer      = bmcval.ProblemAnswer
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
