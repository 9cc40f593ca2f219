package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	xterm "golang.org/x/term"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/internal/cli"
)

// Exit codes of the operator commands (status, explain, reboot, pause, …).
const (
	exitRefused     = 2 // the hub refused: unsafe or not allowed now; the message says why
	exitUnreachable = 4 // the hub's API could not be reached
)

// operatorCommands are the commands that talk to a running hub.
func operatorCommands() []*cobra.Command {
	f := &apiFlags{}
	var cmds []*cobra.Command

	status := &cobra.Command{Use: "status", Short: "Show every machine's verdict, etcd role, remediation and the budget", Args: cobra.NoArgs,
		Example: `  hub status                                   # every machine, the budget, the brakes
  hub status -o wide                           # with each machine's probes and observers
  hub status -o json | jq '.machines[] | select(.verdict != "Healthy")'
  kubectl -n hale-system exec deploy/hale-hub -- hub status --socket /run/hale/hub.sock   # Kubernetes: ask the leader`}
	output := cli.OutputFlag(status)
	status.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := usageErr(cli.CheckOutput(*output)); err != nil {
			return err
		}
		st, err := f.status(cmd.Context())
		if err != nil {
			return err
		}
		if ok, err := cli.WriteData(cmd.OutOrStdout(), *output, st); ok {
			return err
		}
		printStatus(cmd.OutOrStdout(), st, *output == cli.Wide)
		return nil
	}
	cmds = append(cmds, status)

	explain := &cobra.Command{Use: "explain MACHINE", Short: "Say why the hub does (or does not) act on a machine", Args: cobra.ExactArgs(1),
		Example: `  hub explain cp-2            # its verdict, each observer's vote, the hold or the plan, and why
  hub explain cp-2 -o yaml`}
	explainOutput := cli.OutputFlag(explain)
	explain.RunE = func(cmd *cobra.Command, args []string) error {
		if err := usageErr(cli.CheckOutput(*explainOutput)); err != nil {
			return err
		}
		c, err := f.client()
		if err != nil {
			return err
		}
		var e operator.Explanation
		if err := c.do(cmd.Context(), http.MethodGet, "/v1/machines/"+url.PathEscape(args[0])+"/explain", nil, &e); err != nil {
			return err
		}
		if ok, err := cli.WriteData(cmd.OutOrStdout(), *explainOutput, e); ok {
			return err
		}
		_, err = io.WriteString(cmd.OutOrStdout(), e.String())
		return err
	}
	cmds = append(cmds, explain)

	cmds = append(cmds, newRecoverCommand(f), newRebootCommand(f))

	var wait bool
	var waitFor time.Duration
	var reason string
	pause := &cobra.Command{Use: "pause", Short: "Pause the hub: no new step starts; acknowledged (Paused) once steps in flight reached a checkpoint",
		Example: `  hub pause --reason "firmware upgrade, CHG-1234"   # Pausing until steps in flight reach a checkpoint
  hub pause --wait --timeout 5m                     # returns once Paused (exit 2 if not within 5m)`,
		Args: cobra.NoArgs, RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var st operator.Status
			if err := c.do(cmd.Context(), http.MethodPost, "/v1/pause", brakeBody(reason), &st); err != nil {
				return err
			}
			deadline := time.Now().Add(waitFor)
			for wait && st.Pause != operator.Paused {
				if time.Now().After(deadline) {
					return &codedError{exitRefused, fmt.Errorf("still %s after %v: a step in flight has not reached a checkpoint (`hub status`)", st.Pause, waitFor)}
				}
				time.Sleep(200 * time.Millisecond)
				if err := c.do(cmd.Context(), http.MethodGet, "/v1/status", nil, &st); err != nil {
					return err
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), st.Pause)
			return nil
		}}
	pause.Flags().BoolVar(&wait, "wait", false, "block until the pause is acknowledged (Paused)")
	pause.Flags().StringVar(&reason, "reason", "", "why, for status and the record (who is taken from $USER)")
	pause.Flags().DurationVar(&waitFor, "timeout", 10*time.Minute, "with --wait: give up after this long (exit 2)")
	cmds = append(cmds, pause)

	for _, v := range []struct{ use, short, path, example string }{
		{"resume", "Lift your pause (a pause from another source, such as a paused Cluster API Cluster, holds until it is lifted there)", "/v1/resume",
			`  hub resume --reason "firmware upgrade done"`},
		{"suspend", "Make the hub observe-only: it computes and explains, it executes nothing", "/v1/suspend",
			`  hub suspend --reason "debugging a verdict"   # then: hub status, hub explain MACHINE`},
		{"unsuspend", "End observe-only mode", "/v1/unsuspend", `  hub unsuspend`},
	} {
		var reason string
		c := &cobra.Command{Use: v.use, Short: v.short, Example: v.example, Args: cobra.NoArgs, RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var st operator.Status
			if err := c.do(cmd.Context(), http.MethodPost, v.path, brakeBody(reason), &st); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s, suspended: %v\n", st.Pause, st.Suspended)
			if len(st.PausedBy) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "paused by: %s\n", hub.DescribeBrakes(st.PausedBy))
			}
			return nil
		}}
		c.Flags().StringVar(&reason, "reason", "", "why, for status and the record (who is taken from $USER)")
		cmds = append(cmds, c)
	}
	for _, v := range []struct{ use, short, example string }{
		{"detach", "Detach a machine: no action and no BMC call for it until attached",
			`  hub detach cp-1 --reason "RAM replacement, CHG-1234"   # hands off cp-1 (its BMC too)`},
		{"attach", "Attach a detached machine again", `  hub attach cp-1`},
	} {
		var reason string
		c := &cobra.Command{Use: v.use + " MACHINE", Short: v.short, Example: v.example, Args: cobra.ExactArgs(1), RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			if err := c.do(cmd.Context(), http.MethodPost, "/v1/machines/"+url.PathEscape(args[0])+"/"+v.use, brakeBody(reason), nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %sed\n", args[0], v.use)
			return nil
		}}
		c.Flags().StringVar(&reason, "reason", "", "why, for status and the record (who is taken from $USER)")
		cmds = append(cmds, c)
	}
	for _, c := range cmds {
		f.register(c)
		if c.Args != nil && strings.HasSuffix(c.Use, " MACHINE") {
			c.ValidArgsFunction = machineNames(f)
		}
	}
	return cmds
}

// machineNames completes a MACHINE argument with the machines the hub knows (asked over its API; none
// when it does not answer).
func machineNames(f *apiFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		st, err := f.status(cmd.Context())
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var names []cobra.Completion
		for _, m := range st.Machines {
			names = append(names, cobra.CompletionWithDesc(m.Name, string(m.Verdict)))
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// brakeBody says who asks (the user running the command) and why.
func brakeBody(reason string) operator.BrakeRequest {
	by := pass.Operator
	if u := os.Getenv("USER"); u != "" {
		by = "operator " + u
	}
	return operator.BrakeRequest{By: by, Reason: reason}
}

// interactive says whether in can answer a prompt: a terminal, or (in tests) a reader that is not a
// file. A pipe or /dev/null cannot confirm --force: that needs --yes.
func interactive(in io.Reader) bool {
	f, ok := in.(*os.File)
	return !ok || xterm.IsTerminal(int(f.Fd()))
}
