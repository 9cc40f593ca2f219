// Command chaos runs seeded fault schedules against real Hale processes in network namespaces and
// checks the outcome with a checker that trusts nothing the hub says about itself (see checker.go).
//
//	go run ./test/chaos -runs 10 -seed 1          # seeds 1..10
//	go run ./test/chaos -schedule minority-hub    # a named schedule
//
// Each run: a cluster of three control-plane machines (a real etcd member and agent each; cp-0 and
// cp-1 behind the Redfish simulator, cp-2 behind ipmi_sim, whose power runs those processes), two
// witness hosts and the real `hub run`, each in its own namespace; the schedule's faults over
// -duration; then a quiet period in which every fault is undone and every machine must heal within
// -heal. It prints one line a run and a summary table; a failing run prints the command that replays
// it and keeps its logs. It needs root, ip, iptables, ipmi_sim and ipmitool, and the etcd binary
// test/kube/build-assets builds.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/test/lab"
	"github.com/hale-dev/hale/test/netns"
)

// options are a campaign's settings.
type options struct {
	runs           int
	seed           uint64
	duration, heal time.Duration
	schedule, dir  string
	keep           bool
	out            io.Writer
	shape          lab.Shape
	replay         string         // the command line prefix that replays a run
	binaries       netns.Binaries // built by campaign when zero
}

func main() {
	var o options
	var seed int64
	flag.IntVar(&o.runs, "runs", 1, "how many runs (seeds seed, seed+1, …)")
	flag.Int64Var(&seed, "seed", time.Now().UnixNano()%100000, "the first run's seed")
	flag.DurationVar(&o.duration, "duration", 150*time.Second, "how long a run's faults go on")
	flag.DurationVar(&o.heal, "heal", 120*time.Second, "how long, once every fault is undone, every machine has to be healthy again")
	flag.StringVar(&o.schedule, "schedule", "", "a named schedule instead of seeds: "+strings.Join(scheduleNames(), ", ")+
		" (or checker-selftest: a healthy voter power-cycled behind the hub's back, which must fail property 2)")
	flag.StringVar(&o.dir, "dir", filepath.Join(os.TempDir(), "hale-chaos"), "where runs keep their logs")
	flag.BoolVar(&o.keep, "keep", false, "keep the logs of passing runs too")
	flag.Parse()
	if seed < 0 {
		fmt.Fprintln(os.Stderr, "chaos: -seed must be 0 or more")
		os.Exit(2)
	}
	o.seed, o.out = uint64(seed), os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, err := campaign(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	for _, r := range results {
		if !r.passed() {
			os.Exit(1)
		}
	}
}

func scheduleNames() []string {
	var out []string
	for n := range named {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// campaign runs o.runs schedules (or the named one) and prints a line each and a summary.
func campaign(ctx context.Context, o options) ([]result, error) {
	if why := netns.Available(); why != "" {
		return nil, errors.New(why)
	}
	for _, bin := range []string{"ipmi_sim", "ipmitool"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%s is not on PATH (Debian: openipmi, ipmitool; test/run installs them)", bin)
		}
	}
	if o.schedule != "" && named[o.schedule] == nil && o.schedule != selfTest(0).Name {
		return nil, fmt.Errorf("-schedule %q: no such schedule (there are: %s)", o.schedule, strings.Join(scheduleNames(), ", "))
	}
	if o.duration < 30*time.Second {
		return nil, fmt.Errorf("-duration %v: at least 30s (faults begin 5 s in and last up to 20 s)", o.duration)
	}
	if o.shape == (lab.Shape{}) {
		o.shape = lab.Shape{Machines: 3, Witnesses: 2, IPMI: 1}
	}
	if o.replay == "" {
		o.replay = "go run ./test/chaos"
	}
	if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return nil, fmt.Errorf("-dir: %w", err)
	}
	if o.binaries == (netns.Binaries{}) {
		bins, cleanup, err := build(o.dir)
		if err != nil {
			return nil, err
		}
		defer cleanup()
		o.binaries = bins
	}
	var results []result
	for i := range o.runs {
		if ctx.Err() != nil {
			break
		}
		s := generate(o.seed+uint64(i), o.duration, o.shape)
		replay := fmt.Sprintf("%s -seed %d -duration %v", o.replay, s.Seed, o.duration)
		if o.schedule == selfTest(0).Name {
			s = selfTest(o.duration)
			replay = fmt.Sprintf("%s -schedule %s -duration %v", o.replay, o.schedule, o.duration)
		} else if o.schedule != "" {
			s = named[o.schedule](o.duration)
			replay = fmt.Sprintf("%s -schedule %s -duration %v", o.replay, o.schedule, o.duration)
		}
		r, dir := runSchedule(ctx, o, s)
		fmt.Fprintln(o.out, r.line())
		for _, t := range r.TradeOffs {
			fmt.Fprintf(o.out, "    far side: %s\n", t)
		}
		for _, h := range r.Held {
			fmt.Fprintf(o.out, "    held: %s\n", h)
		}
		for _, a := range r.Recoveries {
			fmt.Fprintf(o.out, "    hub recover --yes: %s\n", a)
		}
		if !r.passed() {
			for p, vs := range r.Violations {
				for _, v := range vs {
					fmt.Fprintf(o.out, "    P%d %s\n", p+1, v)
				}
			}
			fmt.Fprintf(o.out, "    replay: %s\n    logs:   %s\n", replay, dir)
		} else if !o.keep {
			os.RemoveAll(dir)
		}
		results = append(results, r)
	}
	summary(o.out, results)
	return results, nil
}

// build builds the binaries under test into a new directory under dir; cleanup removes it.
func build(dir string) (netns.Binaries, func(), error) {
	bdir, err := os.MkdirTemp(dir, "bin-")
	if err != nil {
		return netns.Binaries{}, nil, err
	}
	b, err := netns.Build(bdir)
	if err != nil {
		os.RemoveAll(bdir)
		return netns.Binaries{}, nil, err
	}
	return b, func() { os.RemoveAll(bdir) }, nil
}

// runSchedule runs one schedule in its own directory and returns the result and the directory.
func runSchedule(ctx context.Context, o options, s schedule) (res result, dir string) {
	res.Schedule, res.Faults = s, len(s.Faults)
	dir, err := os.MkdirTemp(o.dir, strings.ReplaceAll(s.Name, " ", "-")+"-")
	if err != nil {
		res.Err = err.Error()
		return res, dir
	}
	logf, err := os.Create(filepath.Join(dir, "run.log"))
	if err != nil {
		res.Err = err.Error()
		return res, dir
	}
	defer logf.Close()
	r := &netns.Program{Dir: dir, Log: logf}
	defer r.Close()
	err = r.Run(func() {
		tl := &timeline{start: time.Now(), log: logf}
		for _, f := range s.Faults {
			fmt.Fprintf(logf, "schedule: at %5.1fs %s for %.1fs\n", f.At.Seconds(), f, f.For.Seconds())
		}
		// Every run acts soon (lab.ActSoon) beside its schedule's policy: the checker judges what the hub
		// does when it acts, on as many of the faults as it can.
		c := lab.Start(r, o.binaries, o.shape, lab.Options{Policy: strings.Join(slices.DeleteFunc([]string{lab.ActSoon, s.Policy}, func(p string) bool { return p == "" }), ", "),
			OnEvent: tl.add, StaticPods: s.StaticPods, HubArgs: s.HubArgs})
		chk := newChecker(c, tl)
		sctx, stopSampling := context.WithCancel(ctx)
		defer stopSampling()
		go chk.run(sctx)
		if !waitHealthy(ctx, chk, 90*time.Second, nil) || !hubSeesAll(ctx, c, 60*time.Second) {
			r.Fatalf("the cluster was not healthy within 90 s of its start (see %s)", dir)
		}
		tl.add("start", "", s.Name)
		in := newInjector(c, tl, chk)
		in.play(ctx, s, time.Now())
		tl.add("quiet", "", "every fault undone; the machines must heal within "+o.heal.String())
		in.quiet()
		quietAt := time.Now()
		if waitHealthy(ctx, chk, o.heal, rateLimitedPastBound(ctx, c, tl.start, quietAt.Add(o.heal))) {
			res.HealedIn = time.Since(quietAt)
			res.HubSees = hubSeesAll(ctx, c, 30*time.Second)
		}
		res.Checked[4] = 1
		stopSampling()
		evaluate(&res, tl, chk.all(), machineNames(c), requestsOf(c, tl))
		res.Rejected = c.HubRejected(ctx)
		if res.HealedIn == 0 {
			held(ctx, c, chk, &res)
		}
		fmt.Fprintf(logf, "result: %s\n", res.line())
	})
	if err != nil { // a harness error (Fatalf), not the checker's verdict
		res.Err = err.Error()
		fmt.Fprintf(logf, "error: %v\n", err)
	}
	return res, dir
}

// waitHealthy waits, for at most within, until every machine is healthy (true); stuck, when given, is
// asked about each sample that is not, and ends the wait unhealed (false) when it says waiting longer
// changes nothing.
func waitHealthy(ctx context.Context, chk *checker, within time.Duration, stuck func(sample) bool) bool {
	for end := time.Now().Add(within); time.Now().Before(end) && ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		s, ok := chk.latest()
		if ok && s.allHealthy() {
			return true
		}
		if ok && stuck != nil && stuck(s) {
			return false
		}
	}
	return false
}

// rateLimitedPastBound is the quiet period's stuck (waitHealthy): every 2 s it asks the hub whether each
// machine that is not healthy is held by its rate limit, whose window cannot pass within the bound
// (end): every remediation it counts began in this run (since start), so it holds until start plus
// the window at the earliest, and waiting out the bound changes nothing (seed 1, on a loaded machine:
// cp-0 powered off as a far-side voter, then held by the rate limit for the whole 120 s). held judges
// the result.
func rateLimitedPastBound(ctx context.Context, c *lab.Cluster, start, end time.Time) func(sample) bool {
	var asked time.Time
	return func(s sample) bool {
		if time.Since(asked) < 2*time.Second {
			return false
		}
		asked = time.Now()
		return rateLimitedPast(ctx, c, s, start, end)
	}
}

// rateLimitWindow reads the window out of a rate-limit hold's decision (hub/pass: "rate limit: 3
// remediations started in the last 10m0s (max 3): …").
var rateLimitWindow = regexp.MustCompile(`^rate limit: \d+ remediations started in the last (\S+) \(max `)

// rateLimitedPast says whether every machine sample s does not see healthy is held by the hub's rate
// limit until after end (start plus its window), and there is one (the run may be unhealed for
// another reason: a voter missing, the hub down).
func rateLimitedPast(ctx context.Context, c *lab.Cluster, s sample, start, end time.Time) bool {
	st, err := c.Status(ctx)
	if err != nil {
		return false
	}
	decisions := map[string]string{}
	for _, m := range st.Machines {
		decisions[m.Name] = m.Decision
	}
	notHealthy := 0
	for i, ok := range s.healthy() {
		if ok && s.Members[i].AgentUp {
			continue
		}
		notHealthy++
		w := rateLimitWindow.FindStringSubmatch(decisions[c.Machines[i].Name])
		if w == nil {
			return false
		}
		if window, err := time.ParseDuration(w[1]); err != nil || !start.Add(window).After(end) {
			return false
		}
	}
	return notHealthy > 0
}

// hubSeesAll waits until the hub hears every expected observer and calls every machine Healthy: the
// faults begin from a settled cluster. (The harness's only use of the hub's word besides property 5.)
func hubSeesAll(ctx context.Context, c *lab.Cluster, within time.Duration) bool {
	for end := time.Now().Add(within); time.Now().Before(end) && ctx.Err() == nil; time.Sleep(500 * time.Millisecond) {
		st, err := c.Status(ctx)
		if err != nil || len(st.Observers.Heard) != st.Observers.Expected || len(st.Machines) == 0 {
			continue
		}
		ok := true
		for _, m := range st.Machines {
			ok = ok && m.Verdict == assess.VerdictHealthy && m.Remediation == nil
		}
		if ok {
			return true
		}
	}
	return false
}

func machineNames(c *lab.Cluster) []string {
	var out []string
	for _, m := range c.Machines {
		out = append(out, m.Name)
	}
	return out
}

// requestsOf gathers the state-changing requests the BMCs got: Redfish resets (recorded as they
// came) and ipmi_sim's chassis calls.
func requestsOf(c *lab.Cluster, tl *timeline) []request {
	var out []request
	for _, e := range tl.all() {
		if e.Kind == "bmc-request" {
			out = append(out, request{At: e.At, Machine: e.Target, Detail: "a Redfish reset"})
		}
	}
	for name, sim := range c.IPMI {
		for _, a := range sim.TimedActions() {
			out = append(out, request{At: a.At, Machine: name, Detail: "IPMI " + a.What})
		}
	}
	slices.SortFunc(out, func(a, b request) int { return a.At.Compare(b.At) })
	return out
}

// held is property 5 for machines still unhealthy at the bound: each must be held by the hub with a
// reason it gives (its status's decision for the machine); anything else is a violation. A machine
// seen healthy in any sample of the last 3 s counts as healthy: one sample in which the leader's
// status read timed out (a busy machine) shows every member unhealthy.
func held(ctx context.Context, c *lab.Cluster, chk *checker, res *result) {
	st, err := c.Status(ctx)
	h := make([]bool, len(c.Machines))
	for _, s := range chk.all() {
		if time.Since(s.At) > 3*time.Second {
			continue
		}
		for i, ok := range s.healthy() {
			h[i] = h[i] || ok && s.Members[i].AgentUp
		}
	}
	for i, m := range c.Machines {
		if h[i] {
			continue
		}
		reason := ""
		for _, ms := range st.Machines {
			if ms.Name == m.Name {
				reason = ms.Decision
			}
		}
		if reason == "" {
			res.Violations[4] = append(res.Violations[4], fmt.Sprintf("%s not healthy %v after the quiet period began, and the hub gives no reason (status: %v)",
				m.Name, chk.tl.since(time.Now()), errOr(err, "no decision")))
			continue
		}
		res.Held = append(res.Held, m.Name+": "+reason)
	}
	if len(res.Held) == 0 && len(res.Violations[4]) == 0 {
		res.Violations[4] = append(res.Violations[4], "not every machine healthy within the bound (the hub or an agent is down)")
	}
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

// summary prints the campaign's table.
func summary(w io.Writer, results []result) {
	if len(results) == 0 {
		return
	}
	passed, errs, faults, hale, op, far := 0, 0, 0, 0, 0, 0
	var checked, violated [7]int
	var healed []time.Duration
	for _, r := range results {
		if r.passed() {
			passed++
		}
		if r.Err != "" {
			errs++
		}
		faults += r.Faults
		far += len(r.TradeOffs)
		hale += r.count("hale")
		op += len(r.Actions) - r.count("hale")
		for i := range checked {
			checked[i] += r.Checked[i]
			violated[i] += len(r.Violations[i])
		}
		if r.HealedIn > 0 {
			healed = append(healed, r.HealedIn)
		}
	}
	fmt.Fprintf(w, "\nruns %d: %d passed, %d failed, %d harness errors; %d faults; power actions: hale %d, operator %d\n",
		len(results), passed, len(results)-passed-errs, errs, faults, hale, op)
	names := []string{"1 quorum never cost by Hale", "2 no healthy voter power-cycled, none without a majority", "3 one power action per step (cooldown)",
		"4 nothing while detached, paused or suspended", "5 healed (or held with a reason) after the quiet period",
		"6 never 'lost for good', no recovery, while a quorum holds", "7 never two etcd clusters serving at once"}
	fmt.Fprintf(w, "%-58s %8s %10s\n", "property", "checked", "violations")
	for i, n := range names {
		fmt.Fprintf(w, "%-58s %8d %10d\n", n, checked[i], violated[i])
	}
	fmt.Fprintf(w, "%-58s %8s %10d\n", "healthy voters power-cycled on the far side of a partition", "", far)
	if len(healed) > 0 {
		slices.Sort(healed)
		fmt.Fprintf(w, "quiet period → every machine healthy: p50 %v, max %v (%d of %d runs)\n",
			healed[len(healed)/2].Round(100*time.Millisecond), healed[len(healed)-1].Round(100*time.Millisecond), len(healed), len(results))
	}
}
