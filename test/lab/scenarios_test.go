package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/test/demo"
	"github.com/hale-dev/hale/test/lab/inproc"
	"github.com/hale-dev/hale/test/netns"
)

// TestScenariosOnRealProcesses runs the demo's scenarios that need no more than a demo.Rig (a hang,
// two hung at once, a partition, a refused reboot) on real processes: etcd and agent binaries in
// network namespaces, the `hub run` binary reached through `hub status`, `hub reboot`, `hub detach`
// and `hub explain` as an operator types them, a partition in iptables (etcd's traffic cut too, not
// the gossip alone), a hang a SIGSTOP. The same code runs on the in-process cluster in test/demo and
// hale-demo.
func TestScenariosOnRealProcesses(t *testing.T) {
	t.Parallel() // beside the stall matrix and the partition, each on a lab of its own
	// The in-process inventory's pace: a 1-s cooldown, up to 20 remediations a minute (cp-2 is healed in
	// three scenarios of four), the demo's stall tolerance and component grace.
	c := Start(t, bins, Shape{Machines: 3, Witnesses: 2}, Options{Cooldown: time.Second,
		Policy: "rateLimit: {max: 20, per: 1m}, " + inproc.DemoPacePolicy()})
	r := &namespaceRig{c: c, t: t, start: time.Now()}
	var portable []demo.Scenario
	for _, s := range demo.Scenarios() {
		if !s.InProcessOnly {
			portable = append(portable, s)
		}
	}
	require.NotEmpty(t, portable)
	for _, s := range portable {
		t.Run(s.Name, func(t *testing.T) {
			start := time.Now()
			require.NoError(t, demo.Run(t.Context(), r, []demo.Scenario{s}))
			t.Logf("scenario %s on real processes: %v", s.Name, time.Since(start).Round(100*time.Millisecond))
		})
	}
}

// namespaceRig is the namespace lab as a demo.Rig: its hub reached as an operator reaches it, through
// the hub binary's commands.
type namespaceRig struct {
	c     *Cluster
	t     *testing.T
	start time.Time
}

func (r *namespaceRig) Name(i int) string    { return r.c.Machines[i].Name }
func (r *namespaceRig) Witness(i int) string { return r.c.Witnesses[i].Name }
func (r *namespaceRig) HubName() string      { return r.c.HubHost.Name }

func (r *namespaceRig) Say(who, format string, args ...any) {
	r.t.Logf("%8.3fs  %-5s %s", time.Since(r.start).Seconds(), who, fmt.Sprintf(format, args...))
}

func (r *namespaceRig) WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s\n%s", timeout, what, r.Dump())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func (r *namespaceRig) Settle(ctx context.Context) error {
	if err := r.WaitFor(ctx, 60*time.Second, "every machine Healthy", r.AllHealthy); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(r.c.Cooldown + 100*time.Millisecond):
	}
	return nil
}

func (r *namespaceRig) AllHealthy() bool {
	st, err := status(r.t.Context(), r.c)
	return err == nil && allHealthy(st)
}

func (r *namespaceRig) Hang(i int)   { r.c.Machines[i].Hang() }
func (r *namespaceRig) Resume(i int) { r.c.Machines[i].Resume() }
func (r *namespaceRig) Panic(i int)  { r.c.Machines[i].Panic() }

// Partition cuts every packet between the hosts named in a and those in b.
func (r *namespaceRig) Partition(a, b []string) {
	r.Say("demo", "network partition: {%s} cut off from {%s}", strings.Join(a, ", "), strings.Join(b, ", "))
	r.c.Lab.Cut(r.hosts(a), r.hosts(b))
}

func (r *namespaceRig) Heal() {
	r.Say("demo", "the partition heals")
	r.c.Lab.Heal()
}

func (r *namespaceRig) hosts(names []string) []*netns.Host {
	all := append([]*netns.Host{r.c.HubHost}, r.c.Witnesses...)
	for _, m := range r.c.Machines {
		all = append(all, m.Host)
	}
	var out []*netns.Host
	for _, n := range names {
		i := slices.IndexFunc(all, func(h *netns.Host) bool { return h.Name == n })
		if i < 0 {
			r.t.Fatalf("lab: no host %s", n)
		}
		out = append(out, all[i])
	}
	return out
}

func (r *namespaceRig) Resets(i int) []string { return r.c.Redfish.Resets(r.Name(i)) }

// Remediations reads `hub explain -o json`: its history holds the last 5.
func (r *namespaceRig) Remediations(i int) (int, journal.State) {
	e, ok := r.explain(i)
	if !ok || len(e.History) == 0 {
		return 0, ""
	}
	return len(e.History), e.History[len(e.History)-1].State
}

// Episodes reads `hub explain -o json`.
func (r *namespaceRig) Episodes(i int) []pass.Episode {
	e, _ := r.explain(i)
	return e.Episodes
}

func (r *namespaceRig) explain(i int) (operator.Explanation, bool) {
	return explain(r.t, r.c, r.Name(i))
}

// Dump is `hub status` and the end of the hub's log.
func (r *namespaceRig) Dump() string {
	st, _ := r.c.HubCommand(context.Background(), "status")
	return "hub status:\n" + st + "\nthe hub's log, its last lines:\n" + hubLines(r.c, "")
}

// hubLines are the last 40 lines of the hub's log (hub.log) that hold any of words ("": every line).
func hubLines(c *Cluster, words ...string) string {
	log, _ := os.ReadFile(filepath.Join(c.Lab.Dir(), "hub.log"))
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(string(log)), "\n") {
		if slices.ContainsFunc(words, func(w string) bool { return strings.Contains(line, w) }) {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines[max(0, len(lines)-40):], "\n")
}

// jsonInto reads the JSON document s into v.
func jsonInto(s string, v any) error { return json.Unmarshal([]byte(s), v) }

func (r *namespaceRig) Status(ctx context.Context) (operator.Status, error) { return status(ctx, r.c) }

// Reboot is `hub reboot MACHINE -o json` (with --dry-run, --force --yes, --hard as asked); a refusal
// (exit 2) is hub.ErrRefused with the hub's words.
func (r *namespaceRig) Reboot(ctx context.Context, req operator.RebootRequest) (operator.RebootResult, error) {
	args := []string{"reboot", req.Machine, "-o", "json"}
	for flag, on := range map[string]bool{"--dry-run": req.DryRun, "--force": req.Force, "--yes": req.Force, "--hard": req.Hard} {
		if on {
			args = append(args, flag)
		}
	}
	var res operator.RebootResult
	out, err := r.c.HubOutput(ctx, args...)
	if err != nil {
		return res, operatorError(err)
	}
	return res, json.Unmarshal([]byte(out), &res)
}

// SetDetached is `hub detach` or `hub attach`.
func (r *namespaceRig) SetDetached(ctx context.Context, machine string, on bool, _, reason string) error {
	verb := "attach"
	if on {
		verb = "detach"
	}
	args := []string{verb, machine}
	if reason != "" {
		args = append(args, "--reason", reason)
	}
	_, err := r.c.HubOutput(ctx, args...)
	return operatorError(err)
}

// operatorError is an operator command's failure: exit 2 (the hub refused) is hub.ErrRefused, with the
// command's own words.
func operatorError(err error) error {
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 2 {
		return refused{err}
	}
	return err
}

// refused is a refusal as the hub binary said it.
type refused struct{ error }

func (r refused) Is(target error) bool { return target == hub.ErrRefused }
func (r refused) Unwrap() error        { return r.error }
