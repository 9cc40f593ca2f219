package bmc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/bmc-toolbox/bmclib/v2/providers/ipmitool"
)

// ipmiDriver speaks IPMI over LAN (lanplus) through bmclib's ipmitool provider. ipmitool gets the
// password through its environment (-E), never on its command line.
type ipmiDriver struct {
	ep     Endpoint
	creds  Credentials
	tool   string
	cipher string
	conn   *ipmitool.Conn
	// timeout bounds one ipmitool call (Options.RequestTimeout). An answering BMC takes well under a
	// second; one that does not answer keeps ipmitool retrying its session for about a minute, and
	// with the controller's retries a step would last minutes (found by test/chaos: a pause then
	// waits that long for its checkpoint).
	timeout time.Duration
}

func newIPMIDriver(ep Endpoint, creds Credentials, opts Options) (driver, error) {
	tool := opts.IPMIToolPath
	if tool == "" {
		var err error
		if tool, err = exec.LookPath("ipmitool"); err != nil {
			return nil, fmt.Errorf("BMC endpoint %s: ipmitool is not on PATH; install it (Debian: apt-get install ipmitool). "+
				"bmclib's IPMI provider needs it and silently drops out without it", ep)
		}
	}
	c, err := ipmitool.New(ep.Host, creds.Username, creds.Password(),
		ipmitool.WithPort(strconv.Itoa(ep.Port)), ipmitool.WithCipherSuite(opts.IPMICipherSuite), ipmitool.WithIpmitoolPath(tool))
	if err != nil {
		return nil, fmt.Errorf("BMC endpoint %s: ipmitool at %s: %w", ep, tool, err)
	}
	return &ipmiDriver{ep: ep, creds: creds, tool: tool, cipher: opts.IPMICipherSuite, conn: c, timeout: opts.RequestTimeout}, nil
}

func (d *ipmiDriver) name() string { return DriverIPMI }

// open returns the driver itself: every ipmitool call is its own session.
func (d *ipmiDriver) open(context.Context) (conn, error) { return d, nil }

func (d *ipmiDriver) close() {}

func (d *ipmiDriver) state(ctx context.Context) (PowerState, time.Time, error) {
	cctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	out, err := d.conn.PowerStateGet(cctx)
	if err != nil {
		return PowerUnknown, time.Time{}, d.classify(ctx, cctx, "chassis power status", err)
	}
	return parseIPMIPower(out)
}

// parseIPMIPower reads ipmitool's "Chassis Power is on|off".
func parseIPMIPower(out string) (PowerState, time.Time, error) {
	switch {
	case strings.Contains(out, "Chassis Power is on"):
		return PowerOn, time.Time{}, nil
	case strings.Contains(out, "Chassis Power is off"):
		return PowerOff, time.Time{}, nil
	}
	return PowerUnknown, time.Time{}, refused(fmt.Errorf("chassis power status: unexpected answer %q", strings.TrimSpace(out)))
}

func ipmiCommand(a action) string {
	switch a {
	case actOn:
		return "on"
	case actGracefulOff:
		return "soft"
	case actForceOff:
		return "off"
	case actPowerCycle:
		return "cycle"
	case actForceRestart:
		return "reset"
	}
	return "" // IPMI has no graceful restart
}

func (d *ipmiDriver) supports(a action) bool { return ipmiCommand(a) != "" }

func (d *ipmiDriver) do(ctx context.Context, a action) (string, error) {
	cmd := ipmiCommand(a)
	if cmd == "" {
		return "", refused(fmt.Errorf("IPMI has no %s", a))
	}
	what := "chassis power " + cmd
	cctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	ok, err := d.conn.PowerSet(cctx, cmd)
	if err != nil {
		return "", d.classify(ctx, cctx, what, err)
	}
	if !ok {
		return "", refused(fmt.Errorf("%s: the BMC did not confirm it", what))
	}
	return what, nil
}

// sessionFailure is ipmitool's answer both to wrong credentials and to an unreachable BMC.
const sessionFailure = "Unable to establish IPMI v2 / RMCP+ session"

// classify turns an ipmitool failure into an error class. ipmitool says the same thing for a wrong
// password and for a BMC that does not answer, so a session failure is diagnosed with one verbose call.
// A call that ran out of its own time (call, not the caller's ctx) is a BMC that does not answer:
// transient.
func (d *ipmiDriver) classify(ctx, call context.Context, what string, err error) error {
	err = fmt.Errorf("%s: %w", what, err)
	switch {
	case ctx.Err() != nil:
		return deadlineRanOut(ctx, what)
	case call.Err() != nil:
		return transient(&marked{[]error{ErrUnreachable}, fmt.Sprintf("%s: no answer from %s:%d within %v", what, d.ep.Host, d.ep.Port, d.timeout)})
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return err
	case strings.Contains(err.Error(), sessionFailure):
		if d.credentialsRejected(ctx) {
			return authFailed(fmt.Errorf("%s: the BMC rejected user %q", what, d.creds.Username))
		}
		return transient(&marked{[]error{ErrUnreachable}, fmt.Sprintf("%s: no IPMI session with %s:%d (or IPMI over LAN disabled)", what, d.ep.Host, d.ep.Port)})
	case strings.Contains(err.Error(), "Insufficient privilege"), strings.Contains(err.Error(), "insufficient privilege"):
		return authFailed(err)
	}
	return refused(err)
}

// credentialsRejected runs one verbose ipmitool session to tell a rejected login (RAKP errors) from
// a BMC that does not answer.
func (d *ipmiDriver) credentialsRejected(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.tool, "-I", "lanplus", "-C", d.cipher, "-H", d.ep.Host, "-p", strconv.Itoa(d.ep.Port),
		"-U", d.creds.Username, "-E", "-v", "-N", "1", "-R", "1", "chassis", "power", "status")
	cmd.Env = append(os.Environ(), "IPMITOOL_PASSWORD="+d.creds.Password())
	out, _ := cmd.CombinedOutput()
	s := string(out)
	return strings.Contains(s, "RAKP 2 HMAC is invalid") || strings.Contains(s, "unauthorized name") ||
		strings.Contains(s, "RAKP 2 message indicates an error") || strings.Contains(s, "invalid integrity check")
}
