package hub

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hale-dev/hale/bmc"
)

// BMC accounts lock after a few failed logins (three to five on most firmware; some stay locked until
// someone clears them at the console). One command makes at most one failed login (package bmc);
// across commands the hub keeps, per BMC account, when the credentials last failed, and makes no
// login to that account again before a backoff window has passed, whatever asks: a remediation's
// step, a resumed remediation reading where it stands (every 5 s), a manual reboot, another machine
// behind the same BMC. The window doubles with each failure in a row, from LoginBackoff (default
// 5 min) to 12 times that, and ends at once when a login succeeds or the inventory names other
// credentials for the account (a reloaded inventory with the corrected password tries at once).

// loginKey is one BMC account: the BMC (driver, host and port; its systems share the account) and the
// user name.
type loginKey struct {
	bmc, user string
}

// loginFailure is the last failed login to an account.
type loginFailure struct {
	endpoint string // the BMC, for status
	// secret is a hash of the credentials that failed (never shown): other credentials may try.
	secret  [sha256.Size]byte
	at      time.Time
	until   time.Time
	inARow  int
	message string
}

// logins is the hub's record of BMC accounts that refused its credentials. Safe for concurrent use:
// executors record, passes and requests read.
type logins struct {
	base   time.Duration
	mu     sync.Mutex
	failed map[loginKey]loginFailure
	// calls counts the guarded calls under way per account; checking holds, per account, a readiness
	// check under way (closed when it ends). A check starts only on an account no call uses, and a
	// call waits for the account's check: two logins at once with the same wrong password would both
	// fail before either was recorded.
	calls    map[loginKey]int
	checking map[loginKey]chan struct{}
}

const maxLoginBackoffFactor = 12

func newLogins(base time.Duration) *logins {
	if base <= 0 {
		base = 5 * time.Minute
	}
	return &logins{base: base, failed: map[loginKey]loginFailure{}, calls: map[loginKey]int{}, checking: map[loginKey]chan struct{}{}}
}

func keyOf(m Machine) loginKey {
	return loginKey{bmc: bmcOf(m), user: m.Credentials.Username}
}

// bmcOf names m's BMC without the system: the systems of one BMC share its accounts.
func bmcOf(m Machine) string {
	ep := m.Endpoint
	ep.SystemID = ""
	return ep.String()
}

func secretOf(c bmc.Credentials) [sha256.Size]byte {
	return sha256.Sum256([]byte(c.Username + "\x00" + c.Password()))
}

// blocked says why no login to m's BMC may be made at now ("" when one may).
func (l *logins) blocked(m Machine, now time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.failed[keyOf(m)]
	if !ok || !now.Before(f.until) || f.secret != secretOf(m.Credentials) {
		return ""
	}
	return fmt.Sprintf("its BMC %s refused the credentials of user %q at %s (%d in a row: %s); no login to that account before %s, so that it does not lock: "+
		"correct the credentials in the inventory (the wait ends when they change) or on the BMC",
		f.endpoint, m.Credentials.Username, f.at.Format(time.TimeOnly), f.inARow, f.message, f.until.Format(time.TimeOnly))
}

// record notes the result of a call to m's BMC that made a login: a failed login starts or doubles the
// account's wait, any other answer ends it.
func (l *logins) record(m Machine, err error, now time.Time) {
	k := keyOf(m)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !errors.Is(err, bmc.ErrAuth) {
		if err == nil {
			delete(l.failed, k)
		}
		return
	}
	f := l.failed[k]
	secret := secretOf(m.Credentials)
	if f.secret != secret {
		f = loginFailure{endpoint: bmcOf(m), secret: secret}
	}
	f.inARow++
	f.at, f.message = now, err.Error()
	factor := maxLoginBackoffFactor
	if f.inARow < 5 { // (a shift past 63 would be 0: no wait at all after 64 failures)
		factor = min(1<<(f.inARow-1), maxLoginBackoffFactor)
	}
	f.until = now.Add(l.base * time.Duration(factor))
	l.failed[k] = f
}

// guarded is a machine's Power behind the hub's login record: a call is refused without reaching the
// BMC while its account waits, and every answer is recorded.
type guarded struct {
	m     Machine
	l     *logins
	power Power
}

func (l *logins) guard(m Machine, p Power) Power {
	return &guarded{m: m, l: l, power: p}
}

// begin waits for a readiness check of m's account to end, then counts a call under way and says
// whether it may log in; end (when not nil) ends the call.
func (g *guarded) begin(ctx context.Context) (end func(), err error) {
	k := keyOf(g.m)
	for {
		g.l.mu.Lock()
		wait, checking := g.l.checking[k]
		if !checking {
			g.l.calls[k]++
			g.l.mu.Unlock()
			break
		}
		g.l.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wait:
		}
	}
	end = func() {
		g.l.mu.Lock()
		if g.l.calls[k]--; g.l.calls[k] == 0 {
			delete(g.l.calls, k)
		}
		g.l.mu.Unlock()
	}
	if why := g.l.blocked(g.m, time.Now()); why != "" {
		end()
		return nil, fmt.Errorf("%w (not tried): %s", bmc.ErrAuth, why)
	}
	return end, nil
}

func (g *guarded) Status(ctx context.Context) (bmc.PowerState, time.Time, error) {
	end, err := g.begin(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	defer end()
	st, at, err := g.power.Status(ctx)
	g.l.record(g.m, err, time.Now())
	return st, at, err
}

// beginCheck starts a readiness check of m's account unless a call uses it (false: check it another
// time); end ends it and lets the calls that wait for it go.
func (l *logins) beginCheck(m Machine) (end func(), ok bool) {
	k := keyOf(m)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.checking[k]; busy || l.calls[k] > 0 {
		return nil, false
	}
	done := make(chan struct{})
	l.checking[k] = done
	return func() {
		l.mu.Lock()
		delete(l.checking, k)
		l.mu.Unlock()
		close(done)
	}, true
}

func (g *guarded) Reboot(ctx context.Context) (bmc.Result, error) { return g.do(ctx, g.power.Reboot) }
func (g *guarded) PowerCycle(ctx context.Context) (bmc.Result, error) {
	return g.do(ctx, g.power.PowerCycle)
}
func (g *guarded) ForceOff(ctx context.Context) (bmc.Result, error) {
	return g.do(ctx, g.power.ForceOff)
}

func (g *guarded) do(ctx context.Context, f func(context.Context) (bmc.Result, error)) (bmc.Result, error) {
	end, err := g.begin(ctx)
	if err != nil {
		return bmc.Result{}, err
	}
	defer end()
	res, err := f(ctx)
	g.l.record(g.m, err, time.Now())
	return res, err
}
