package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/internal/cli"
)

// recoverTimeout is how long `hub recover --yes` waits for the hub by default (--request-timeout
// overrides it): the hub first waits for a remediation inside a BMC operation (minutes at worst, with
// the default timeouts), then fences each lost member (up to 2 minutes each).
const recoverTimeout = 15 * time.Minute

// watchRecovery says on w, while `hub recover --yes` waits, what the hub is doing: its status read
// every 2 s, a line when it changes, and every 15 s one that it goes on. stop ends it.
func watchRecovery(ctx context.Context, f *apiFlags, w io.Writer) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		start, said, saidAt := time.Now(), "", time.Time{}
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			st, err := f.status(ctx)
			if err != nil || ctx.Err() != nil {
				continue
			}
			what := recoveryProgress(st)
			if what != said || time.Since(saidAt) >= 15*time.Second {
				fmt.Fprintf(w, "hub recover: %s (%v so far)\n", what, time.Since(start).Round(time.Second))
				said, saidAt = what, time.Now()
			}
		}
	}()
	return func() { cancel(); <-done }
}

// recoveryProgress says what a hub carrying out `hub recover --yes` is at, from its status.
func recoveryProgress(st operator.Status) string {
	if st.Pause != operator.Pausing {
		return "the hub is " + strings.ToLower(string(st.Pause)) + "; fencing the lost members through their BMCs (each powered off and read back Off)"
	}
	var busy []string
	for _, m := range st.Machines {
		if r := m.Remediation; r != nil && r.Busy && r.Step < len(r.Steps) {
			busy = append(busy, fmt.Sprintf("remediation %s of %s, inside %s", r.ID, m.Name, r.Steps[r.Step]))
		}
	}
	return "the hub is pausing: waiting for a BMC operation under way to end, which cannot be called back (" + strings.Join(busy, "; ") + ")"
}

// newRecoverCommand is `hub recover`: the plan after a permanent loss of quorum, and with --yes the
// hub's part of carrying it out.
func newRecoverCommand(f *apiFlags) *cobra.Command {
	var req operator.RecoverRequest
	var yes bool
	cmd := &cobra.Command{Use: "recover [--yes [--confirm-lost MACHINE,...] [--accept-data-loss N]]",
		Short: "Plan, then begin, etcd's rebuild from its most advanced survivor after a permanent loss of quorum",
		Long: `recover prints the recovery plan after a permanent loss of etcd's quorum: the survivor (the highest
raft index among the members that answer) and why, the data at risk against the raft mark the hub has
journaled, the lost members to fence and how, the revision bump, and each step. Without --yes it
changes nothing. What keeps the plan from going ahead is listed under NOT READY, with what to do:
quorum not lost, a lost member whose BMC reads it powered on (it may serve on the far side of a
partition), one the hub cannot fence, a survivor behind the mark.

With --yes the hub carries out its part: it pauses itself, waits until no BMC operation of a
remediation is under way (one cannot be called back: a power-cycle of a lost member may take a minute
or more; the command says what it waits for as it goes, on standard error), journals the recovery with
a new cluster token, and fences every lost member (powered off through its BMC and read back Off). It
waits up to 15 minutes for all of it unless --request-timeout says otherwise. A recovery that does not
begin (the wait given up, the command interrupted) leaves no pause behind. Run again, it resumes the
recovery it journaled (a hub restarted meanwhile is paused); while one is being carried out, a second
is refused. Then, on the survivor: ` + "`agent recover --plan FILE`" + ` with FILE from ` + "`hub recover -o json`" + `.

--confirm-lost names machines you have checked yourself: lost for good, and off. It is needed for a
lost member whose BMC reads it powered on, one with no evidence that it will not come back, and one
the hub cannot fence (no BMC, or a BMC that does not answer). --accept-data-loss N, when the survivor
is N raft entries behind the hub's journaled mark, accepts losing them; N must be the plan's figure.

Exit codes: 0 the plan is ready (with --yes: fenced), 1 bad usage, 2 something keeps it from going
ahead (NOT READY, or refused), 4 the hub's API could not be reached.`,
		Example: `  hub recover                                           # the plan: survivor, data at risk, fence, steps; changes nothing
  hub recover --yes --confirm-lost cp-1,cp-2            # pause, journal, fence cp-1 and cp-2 (read back Off)
  hub recover -o json > plan.json                       # for agent recover and agent rejoin`,
		Args: cobra.NoArgs}
	output := cli.OutputFlag(cmd)
	fl := cmd.Flags()
	fl.BoolVar(&yes, "yes", false, "carry out the hub's part: journal, pause, fence")
	fl.StringSliceVar(&req.ConfirmLost, "confirm-lost", nil, "machines you confirm by name to be lost for good and off (with --yes)")
	fl.Uint64Var(&req.AcceptDataLoss, "accept-data-loss", 0, "accept losing this many raft entries: the plan's data at risk, exactly (with --yes)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := usageErr(cli.CheckOutput(*output)); err != nil {
			return err
		}
		if !yes && (len(req.ConfirmLost) > 0 || req.AcceptDataLoss > 0) {
			return &codedError{exitUsage, fmt.Errorf("--confirm-lost and --accept-data-loss go with --yes: without it nothing is done")}
		}
		var p pass.RecoveryPlan
		if yes {
			if host, err := os.Hostname(); err == nil {
				req.By = "operator@" + host
			}
			wait := *f
			if !cmd.Flag("request-timeout").Changed {
				wait.timeout = recoverTimeout
			}
			c, err := wait.client()
			if err != nil {
				return err
			}
			stop := watchRecovery(cmd.Context(), f, cmd.ErrOrStderr())
			err = c.do(cmd.Context(), http.MethodPost, "/v1/recovery", req, &p)
			stop()
			if err != nil {
				return err
			}
		} else if c, err := f.client(); err != nil {
			return err
		} else {
			if err := c.do(cmd.Context(), http.MethodGet, "/v1/recovery", nil, &p); err != nil {
				return err
			}
		}
		ok, err := cli.WriteData(cmd.OutOrStdout(), *output, p)
		if !ok {
			_, err = io.WriteString(cmd.OutOrStdout(), p.String())
		}
		if err != nil {
			return err
		}
		if len(p.Blockers) > 0 {
			return &codedError{exitRefused, fmt.Errorf("the recovery plan is not ready: %s", strings.Join(p.Blockers, "; "))}
		}
		return nil
	}
	return cmd
}
