// Package bmcaccess is how the hub reaches BMCs without locking their accounts or asking blind: one
// login record per BMC account (a refused login waits, doubling, before the next), the guard every
// call to a machine's BMC goes through, and the readiness check that asks each BMC before the day it
// is needed.
package bmcaccess

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/pass"
)

// BMC accounts lock after a few failed Logins (three to five on most firmware; some stay locked until
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

// Logins is the hub's record of BMC accounts that refused its credentials. Safe for concurrent use:
// executors record, passes and requests read.
type Logins struct {
	base   time.Duration
	mu     sync.Mutex
	failed map[loginKey]loginFailure
	// calls counts the guarded calls under way per account; checking holds, per account, a readiness
	// check under way (closed when it ends). A check starts only on an account no call uses, and a
	// call waits for the account's check: two Logins at once with the same wrong password would both
	// fail before either was recorded.
	calls    map[loginKey]int
	checking map[loginKey]chan struct{}
	// worked is when the last call to each account that succeeded began: a refusal of a call begun
	// before it is not the credentials' (they logged in since).
	worked map[loginKey]time.Time
}

const maxLoginBackoffFactor = 12

func NewLogins(base time.Duration) *Logins {
	if base <= 0 {
		base = 5 * time.Minute
	}
	return &Logins{base: base, failed: map[loginKey]loginFailure{}, calls: map[loginKey]int{}, checking: map[loginKey]chan struct{}{},
		worked: map[loginKey]time.Time{}}
}

func keyOf(m pass.Machine) loginKey {
	return loginKey{bmc: bmcOf(m), user: m.Credentials.Username}
}

// bmcOf names m's BMC without the system: the systems of one BMC share its accounts.
func bmcOf(m pass.Machine) string {
	ep := m.Endpoint
	ep.SystemID = ""
	return ep.String()
}

func secretOf(c bmc.Credentials) [sha256.Size]byte {
	return sha256.Sum256([]byte(c.Username + "\x00" + c.Password()))
}

// Blocked says why no login to m's BMC may be made at now ("" when one may).
func (l *Logins) Blocked(m pass.Machine, now time.Time) string {
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

// Record notes the result, at now, of a call to m's BMC begun at started: a failed login starts or
// doubles the account's wait, a success ends it, and other answers keep it. A failed login of a call
// begun before the account's last successful one is not recorded: the credentials logged in since (a
// check made after the operator fixed them, while an older call was still under way).
func (l *Logins) Record(m pass.Machine, err error, started, now time.Time) {
	k := keyOf(m)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !errors.Is(err, bmc.ErrAuth) {
		if err == nil {
			delete(l.failed, k)
			l.worked[k] = later(l.worked[k], started)
		}
		return
	}
	if started.Before(l.worked[k]) {
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

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// lift ends k's wait at now, keeping how many failures in a row it had: the next login is tried, and
// a refusal waits longer than the last.
func (l *Logins) lift(k loginKey, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.failed[k]; ok {
		f.until = now
		l.failed[k] = f
	}
}

// guarded is a machine's Power behind the hub's login record: a call is refused without reaching the
// BMC while its account waits, and every answer is recorded. A check's (guardCheck) starts only on an
// account no call uses (errAccountBusy), and calls wait for it.
type guarded struct {
	m     pass.Machine
	l     *Logins
	power execute.Power
	// enter enters the account: enterCall, or enterCheck for a check.
	enter func(context.Context, loginKey) (end func(), err error)
	// seen, when set, is told each power state a call read (a state-changing call's last reading, also
	// when it could not verify the state it asked for).
	seen func(pass.Machine, pass.BMCReadiness)
}

// Guard is m's Power p behind l: a call is refused without reaching the BMC while its account
// waits, every answer is recorded, and seen (when not nil) is told each power state a call read.
func (l *Logins) Guard(m pass.Machine, p execute.Power, seen func(pass.Machine, pass.BMCReadiness)) execute.Power {
	return &guarded{m: m, l: l, power: p, seen: seen, enter: l.enterCall}
}

// guardCheck is Guard for a readiness check; now: an operator's, which waits for a check of the
// account under way to end instead of leaving the account unchecked, and then logs in even if the
// account waits (lift): the operator asked for that login.
func (l *Logins) guardCheck(m pass.Machine, p execute.Power, now bool) execute.Power {
	return &guarded{m: m, l: l, power: p, enter: func(ctx context.Context, k loginKey) (func(), error) {
		end, err := l.enterCheck(ctx, k, now)
		if err == nil && now {
			l.lift(k, time.Now())
		}
		return end, err
	}}
}

// errAccountBusy: a readiness check was not made, a call (a remediation's step) uses the account.
var errAccountBusy = errors.New("the BMC account is in use")

// begin enters m's account (a call waits for a check under way; a check does not start beside a
// call) and says whether it may log in; end (when not nil) leaves it.
func (g *guarded) begin(ctx context.Context) (end func(), err error) {
	if end, err = g.enter(ctx, keyOf(g.m)); err != nil {
		return nil, err
	}
	if why := g.l.Blocked(g.m, time.Now()); why != "" {
		end()
		return nil, fmt.Errorf("%w (not tried): %s", bmc.ErrAuth, why)
	}
	return end, nil
}

// enterCall waits for a readiness check of account k to end, then counts a call under way.
func (l *Logins) enterCall(ctx context.Context, k loginKey) (end func(), err error) {
	for {
		l.mu.Lock()
		wait, checking := l.checking[k]
		if !checking {
			l.calls[k]++
			l.mu.Unlock()
			break
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wait:
		}
	}
	return func() {
		l.mu.Lock()
		if l.calls[k]--; l.calls[k] == 0 {
			delete(l.calls, k)
		}
		l.mu.Unlock()
	}, nil
}

// enterCheck starts a readiness check of account k unless a call uses it or, unless wait, a check is
// under way (errAccountBusy); with wait it starts once that check ended: an operator's check after
// fixing the credentials is what logins made after it say, not what one begun before found. end
// ends it and lets the calls that wait for it go.
func (l *Logins) enterCheck(ctx context.Context, k loginKey, wait bool) (end func(), err error) {
	l.mu.Lock()
	for {
		under, checking := l.checking[k]
		if l.calls[k] > 0 || checking && !wait {
			l.mu.Unlock()
			return nil, errAccountBusy
		}
		if !checking {
			break
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-under:
		}
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	done := make(chan struct{})
	l.checking[k] = done
	return func() {
		l.mu.Lock()
		delete(l.checking, k)
		l.mu.Unlock()
		close(done)
	}, nil
}

func (g *guarded) Status(ctx context.Context) (bmc.PowerState, time.Time, error) {
	end, err := g.begin(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	defer end()
	started := time.Now()
	st, at, err := g.power.Status(ctx)
	g.l.Record(g.m, err, started, time.Now())
	if err == nil {
		g.saw(st, time.Now())
	}
	return st, at, err
}

// saw tells seen a power state read at at.
func (g *guarded) saw(st bmc.PowerState, at time.Time) {
	if g.seen != nil && st != "" && !at.IsZero() {
		g.seen(g.m, pass.BMCReadiness{Checked: at.UTC(), Ready: true, Power: st})
	}
}

// Evidence reads what the BMC says of a hang (the power state, the health, the event log's hangs), or
// only the power state when the Power reads no more.
func (g *guarded) Evidence(ctx context.Context) (bmc.Evidence, error) {
	end, err := g.begin(ctx)
	if err != nil {
		return bmc.Evidence{}, err
	}
	defer end()
	started := time.Now()
	ev, err := evidenceOf(ctx, g.power)
	g.l.Record(g.m, err, started, time.Now())
	if err == nil {
		g.saw(ev.Power, ev.Read)
	}
	return ev, err
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
	started := time.Now()
	res, err := f(ctx)
	g.l.Record(g.m, err, started, time.Now())
	if err == nil || errors.Is(err, bmc.ErrUnverified) {
		g.saw(res.After, res.ObservedAt)
	}
	return res, err
}
