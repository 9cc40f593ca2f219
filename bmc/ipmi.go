package bmc

import (
	"context"
	"errors"
	"fmt"
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
	s, _ := d.ipmitool(ctx, "-v", "chassis", "power", "status")
	return strings.Contains(s, "RAKP 2 HMAC is invalid") || strings.Contains(s, "unauthorized name") ||
		strings.Contains(s, "RAKP 2 message indicates an error") || strings.Contains(s, "invalid integrity check")
}

// ipmitool runs ipmitool against the BMC with args, the password through the environment. The
// environment is only that, as bmclib's own calls have it: ipmitool prints the SEL's times in the zone
// of its environment, and `sel time get` must print the BMC's clock in the zone `sel list` did.
func (d *ipmiDriver) ipmitool(ctx context.Context, args ...string) (string, error) {
	base := []string{"-I", "lanplus", "-C", d.cipher, "-H", d.ep.Host, "-p", strconv.Itoa(d.ep.Port), "-U", d.creds.Username, "-E", "-N", "1", "-R", "1"}
	cmd := exec.CommandContext(ctx, d.tool, append(base, args...)...)
	cmd.Env = []string{"IPMITOOL_PASSWORD=" + d.creds.Password()}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// hangs reads the system event log (SEL) through bmclib and dates its entries against the SEL's own
// clock (`sel time get`), read right after. IPMI has no health roll-up. An entry logged before the SEL's
// clock was set (Pre-Init) while the clock now reads a date, or a log whose clock cannot be read, proves
// nothing: it cannot be dated.
func (d *ipmiDriver) hangs(ctx context.Context) (logRead, error) {
	cctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	sel, err := d.conn.GetSystemEventLog(cctx)
	if err != nil {
		return logRead{err: d.classify(ctx, cctx, "sel list", err)}, nil
	}
	out, err := d.ipmitool(cctx, "sel", "time", "get")
	readAt := time.Now()
	if err != nil {
		return logRead{err: fmt.Errorf("sel time get: %w: %s: the SEL's entries cannot be dated", err, strings.TrimSpace(out))}, nil
	}
	clock, err := parseSELTime(strings.TrimSpace(out))
	if err != nil {
		return logRead{err: fmt.Errorf("sel time get: %w: the SEL's entries cannot be dated", err)}, nil
	}
	var hangs []LogEntry
	for _, e := range sel { // ID, date and time, sensor, "event : assertion" (bmclib's parse of `sel list`)
		if len(e) < 4 {
			continue
		}
		kind := hangKind(e[2], e[3])
		if kind == "" {
			continue
		}
		logged, err := parseSELTime(e[1])
		if err != nil || logged.relative != clock.relative {
			continue
		}
		hangs = append(hangs, LogEntry{ID: e[0], Kind: kind, Message: e[2] + ": " + e[3], Logged: e[1], At: readAt.Add(logged.t.Sub(clock.t))})
	}
	return logRead{hangs: hangs}, nil
}

// selTime is a time as ipmitool prints a SEL's: a date ("12/02/26 03:23:43 UTC", in the zone of
// ipmitool's environment), or, before the SEL's clock was set, seconds since the BMC's start (a
// Pre-Init entry's "Pre-Init 0000000511"; the clock's "S+ 00:08:31"), relative.
type selTime struct {
	t        time.Time // relative: the zero time plus the seconds
	relative bool
}

// parseSELTime reads an SEL time as ipmitool prints it.
func parseSELTime(s string) (selTime, error) {
	f := strings.Fields(s)
	switch {
	case len(f) == 2 && f[0] == "Pre-Init":
		n, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			return selTime{}, fmt.Errorf("SEL time %q: %w", s, err)
		}
		return selTime{t: time.Time{}.Add(time.Duration(n) * time.Second), relative: true}, nil
	case len(f) == 2 && f[0] == "S+":
		var h, m, sec int
		if _, err := fmt.Sscanf(f[1], "%d:%d:%d", &h, &m, &sec); err != nil {
			return selTime{}, fmt.Errorf("SEL time %q: %w", s, err)
		}
		return selTime{t: time.Time{}.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec)*time.Second), relative: true}, nil
	case len(f) >= 2:
		day := f[0] + " " + f[1] // the zone that may follow is ipmitool's environment's, the same for the clock and the entries
		for _, layout := range []string{"01/02/06 15:04:05", "01/02/2006 15:04:05"} {
			if t, err := time.Parse(layout, day); err == nil {
				return selTime{t: t}, nil
			}
		}
	}
	return selTime{}, fmt.Errorf("SEL time %q: not a date, Pre-Init seconds or S+ hh:mm:ss", s)
}
