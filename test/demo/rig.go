package demo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/test/lab/inproc"
)

// machines is how many control-plane machines a rig has for the scenarios.
const machines = 3

// Rig is the cluster a scenario runs on, whichever test/lab backend runs it: the in-process cluster
// (InProcess: the demo, TestScenarios) or the namespace lab's real processes (test/lab). Three
// machines, two witnesses, a hub; the hub is reached as an operator reaches it.
type Rig interface {
	// Name is machine i's name, Witness witness i's, HubName the hub's, on the rig's network.
	Name(i int) string
	Witness(i int) string
	HubName() string
	// Say adds a line to the timeline: who, what.
	Say(who, format string, args ...any)
	// WaitFor polls cond until it holds; on timeout it returns an error with what the hub did.
	WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error
	// Settle waits until every machine is Healthy with nothing in flight, and past the cooldown of the
	// last remediation.
	Settle(ctx context.Context) error
	// AllHealthy: every machine Healthy with a healthy etcd member, and no remediation in flight.
	AllHealthy() bool
	// Hang makes machine i stop answering (its etcd member and its agent); its power stays on. Resume
	// has it answer again by itself (no BMC call). Panic hangs it as a kernel panic does: its BMC logs
	// an OS critical stop.
	Hang(i int)
	Resume(i int)
	Panic(i int)
	// Partition cuts the members named in a off from those in b, both ways, until Heal.
	Partition(a, b []string)
	Heal()
	// Resets are the reset requests machine i's BMC has served.
	Resets(i int) []string
	// Remediations is how many remediations of machine i the hub has journaled, and the latest's state.
	Remediations(i int) (int, journal.State)
	// Episodes are machine i's last episodes, as `hub explain` lists them.
	Episodes(i int) []pass.Episode
	// Dump is the hub's events and journal, for a failure.
	Dump() string

	// Status, Reboot and SetDetached are `hub status`, `hub reboot` and `hub detach`/`attach`.
	Status(ctx context.Context) (operator.Status, error)
	Reboot(ctx context.Context, req operator.RebootRequest) (operator.RebootResult, error)
	SetDetached(ctx context.Context, machine string, on bool, by, reason string) error
}

// InProcess is the in-process cluster as a Rig; its hub is called in the process.
func InProcess(tb *inproc.Cluster) Rig { return inProcess{tb} }

type inProcess struct{ *inproc.Cluster }

func (r inProcess) hub() (*hub.Hub, error) {
	if h := r.Hub(); h != nil {
		return h, nil
	}
	return nil, errors.New("no hub runs")
}

func (r inProcess) Status(ctx context.Context) (operator.Status, error) {
	h, err := r.hub()
	if err != nil {
		return operator.Status{}, err
	}
	return h.Status(ctx), nil
}

func (r inProcess) Reboot(ctx context.Context, req operator.RebootRequest) (operator.RebootResult, error) {
	h, err := r.hub()
	if err != nil {
		return operator.RebootResult{}, err
	}
	return h.Reboot(ctx, req)
}

func (r inProcess) Episodes(i int) []pass.Episode {
	h, err := r.hub()
	if err != nil {
		return nil
	}
	return h.Episodes(r.Name(i))
}

func (r inProcess) SetDetached(ctx context.Context, machine string, on bool, by, reason string) error {
	h, err := r.hub()
	if err != nil {
		return err
	}
	return h.SetDetached(ctx, machine, on, by, reason)
}

// inProcessOnly is the in-process cluster behind r, for a scenario that needs more of it than a Rig
// says (the hub's inventory, the BMC simulator's faults, the etcd members' recovery).
func inProcessOnly(r Rig, scenario string) (*inproc.Cluster, error) {
	if ip, ok := r.(inProcess); ok {
		return ip.Cluster, nil
	}
	return nil, fmt.Errorf("scenario %s runs on the in-process cluster only", scenario)
}

// snapshot counts every machine's BMC resets and journaled remediations, to check what a scenario
// added.
type snapshot struct {
	resets, remediations [machines]int
}

func takeSnapshot(r Rig) snapshot {
	var s snapshot
	for i := range machines {
		s.resets[i] = len(r.Resets(i))
		s.remediations[i], _ = r.Remediations(i)
	}
	return s
}

// expectResets checks that each machine got exactly want[i] more BMC resets than in before.
func expectResets(r Rig, before snapshot, want [machines]int) error {
	var errs []error
	for i := range machines {
		if got := len(r.Resets(i)) - before.resets[i]; got != want[i] {
			errs = append(errs, fmt.Errorf("%s: %d power actions, want %d (%v)", r.Name(i), got, want[i], r.Resets(i)[before.resets[i]:]))
		}
	}
	return errors.Join(errs...)
}

// succeeded: machine i has a new remediation since before and it succeeded.
func succeeded(r Rig, before snapshot, i int) func() bool {
	return func() bool {
		n, st := r.Remediations(i)
		return n > before.remediations[i] && st == journal.Succeeded
	}
}

// hangTogether hangs machines a and b at the same moment.
func hangTogether(r Rig, a, b int) {
	done := make(chan struct{})
	go func() { r.Hang(a); close(done) }()
	r.Hang(b)
	<-done
}

// expectNothing checks, for d, that no machine gets a BMC call, and that the hub says why: by then, or
// within saySlack more (still with no BMC call), as a loaded machine's observers may report late (the
// partition on real processes, beside the real clusters: 6 s after the cut the hub did not hear the
// agent on its own side, which its memberlist had marked failed for lack of acks).
func expectNothing(ctx context.Context, r Rig, d time.Duration, before snapshot, why string) error {
	const saySlack = 10 * time.Second
	start := time.Now()
	for {
		if err := expectResets(r, before, [machines]int{}); err != nil {
			return fmt.Errorf("%w\n%s", err, r.Dump())
		}
		if time.Since(start) >= d {
			st, err := r.Status(ctx)
			if err != nil {
				return err
			}
			if strings.Contains(st.NotPlanning, why) {
				return nil
			}
			if time.Since(start) >= d+saySlack {
				return fmt.Errorf("after %v: the hub says %q, want it to say %q", time.Since(start).Round(time.Second), st.NotPlanning, why)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// lastEpisode is machine i's last episode (ok false: none).
func lastEpisode(r Rig, i int) (pass.Episode, bool) {
	eps := r.Episodes(i)
	if len(eps) == 0 {
		return pass.Episode{}, false
	}
	return eps[len(eps)-1], true
}

// machineStatus is machine name's row of the hub's status (zero when it has none).
func machineStatus(ctx context.Context, r Rig, name string) operator.MachineStatus {
	st, _ := r.Status(ctx)
	for _, m := range st.Machines {
		if m.Name == name {
			return m
		}
	}
	return operator.MachineStatus{}
}
