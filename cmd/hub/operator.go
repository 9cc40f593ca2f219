package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	xterm "golang.org/x/term"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/internal/cli"
)

// Exit codes of the operator commands (status, explain, reboot, pause, …).
const (
	exitRefused     = 2 // the hub refused: unsafe or not allowed now; the message says why
	exitUnreachable = 4 // the hub's API could not be reached
)

// apiClient talks to a running hub's operator API.
type apiClient struct {
	http  *http.Client
	base  string
	token string
	where string // for error messages
}

// apiFlags are the operator commands' flags to find the hub.
type apiFlags struct {
	socket, address, tokenFile string
	timeout                    time.Duration
}

func (f *apiFlags) register(cmd *cobra.Command) {
	f.registerWhere(cmd.PersistentFlags())
	cmd.PersistentFlags().DurationVar(&f.timeout, "request-timeout", 10*time.Second, "how long one API request may take")
}

// registerWhere registers the flags that say where the hub's API is.
func (f *apiFlags) registerWhere(fs *pflag.FlagSet) {
	socket := os.Getenv("HALE_HUB_SOCKET")
	if socket == "" {
		socket = defaultSocket
	}
	fs.StringVar(&f.socket, "socket", socket, "the hub's operator API socket ($HALE_HUB_SOCKET)")
	fs.StringVar(&f.address, "api-address", "", "the hub's loopback API address instead of the socket (needs --token-file)")
	fs.StringVar(&f.tokenFile, "token-file", "", "the API token file, with --api-address")
}

// status asks the hub for its status.
func (f *apiFlags) status(ctx context.Context) (hub.Status, error) {
	var st hub.Status
	c, err := f.client()
	if err == nil {
		err = c.do(ctx, http.MethodGet, "/v1/status", nil, &st)
	}
	return st, err
}

func (f *apiFlags) client() (*apiClient, error) {
	if f.address != "" {
		token, err := readToken("token-file", f.tokenFile)
		if err != nil {
			return nil, err
		}
		return &apiClient{http: &http.Client{Timeout: f.timeout}, base: "http://" + f.address, token: token, where: f.address}, nil
	}
	socket := f.socket
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}
	return &apiClient{http: &http.Client{Timeout: f.timeout, Transport: tr}, base: "http://hub", where: socket}, nil
}

// do sends a request; out is a *string for text answers or a value to decode JSON into.
func (c *apiClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if _, text := out.(*string); !text {
		req.Header.Set("Accept", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return &codedError{exitUnreachable, fmt.Errorf("cannot reach the hub at %s (is `hub run` running, and may you open its socket?): %w", c.where, err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return &codedError{exitUnreachable, fmt.Errorf("reading the hub's answer: %w", err)}
	}
	if resp.StatusCode != http.StatusOK {
		var e hub.APIError
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			return c.notTheHub(fmt.Sprintf("%s (%q)", resp.Status, firstLine(string(b))))
		}
		code := exitUsage
		if resp.StatusCode == http.StatusConflict {
			code = exitRefused
		}
		return &codedError{code, errors.New(e.Error)}
	}
	if s, ok := out.(*string); ok {
		*s = string(b)
		return nil
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return c.notTheHub(fmt.Sprintf("%s to %s %s, which is no answer of Hale's (%v)", resp.Status, method, path, err))
		}
	}
	return nil
}

// notTheHub is the error for an answer that is not the operator API's: another server listens where
// the command was pointed (the hub's metrics port, say).
func (c *apiClient) notTheHub(answer string) error {
	return &codedError{exitUnreachable, fmt.Errorf("%s answered %s: that is not the hub's operator API. Point the command at the hub's "+
		"--socket, or at the address `hub run --api-address` serves (not its --metrics-address)", c.where, answer)}
}

// firstLine is s's first line, at most 200 characters.
func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	if len(line) > 200 {
		line = line[:200] + "…"
	}
	return line
}

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
		var e hub.Explanation
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
			var st hub.Status
			if err := c.do(cmd.Context(), http.MethodPost, "/v1/pause", brakeBody(reason), &st); err != nil {
				return err
			}
			deadline := time.Now().Add(waitFor)
			for wait && st.Pause != hub.Paused {
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
			var st hub.Status
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
func brakeBody(reason string) hub.BrakeRequest {
	by := pass.Operator
	if u := os.Getenv("USER"); u != "" {
		by = "operator " + u
	}
	return hub.BrakeRequest{By: by, Reason: reason}
}

func newRebootCommand(f *apiFlags) *cobra.Command {
	var req hub.RebootRequest
	var yes, wait, kubernetes bool
	var k kubeOptions
	cmd := &cobra.Command{
		Use:   "reboot MACHINE",
		Short: "Reboot a machine through its BMC, checked against etcd's quorum and journaled like the hub's own remediations",
		Long: `Reboot a machine through its BMC. The reboot goes through the same quorum check and journal as the
hub's own remediations: it is refused, with the reason, when it would cost quorum (or the budget the
policy keeps). --force goes ahead anyway; it asks you to type the machine's name again (or --yes),
and the journal records the refusal it overrode.

With --kubernetes the request is a Remediation object in the hub's namespace instead of a call to the
hub's API: Kubernetes RBAC decides who may reboot (create on remediations.hale.dev), and the leading
hub replica checks and carries it out the same way (` + "`kubectl get remediations`" + ` shows it).`,
		Example: `  hub reboot cp-1 --dry-run         # the quorum check and the plan; nothing changes
  hub reboot cp-1 --wait            # reboot it, and wait until it is back
  hub reboot cp-1 --hard            # power-cycle at once (no graceful restart first)
  hub reboot cp-1 --kubernetes      # as a Remediation object: Kubernetes RBAC decides`,
		Args: cobra.ExactArgs(1),
	}
	output := cli.OutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		req.Machine = args[0]
		if host, err := os.Hostname(); err == nil {
			req.By = "operator@" + host
		}
		if err := usageErr(cli.CheckOutput(*output)); err != nil {
			return err
		}
		// With -o json|yaml, standard output holds one document (the result, or the ended
		// remediation with --wait); what the command says as it goes, prompts included, goes to
		// standard error.
		out, data := cmd.OutOrStdout(), *output == cli.JSON || *output == cli.YAML
		if data {
			out = cmd.ErrOrStderr()
		}
		emit := func(v any, err error) error {
			if data {
				if _, werr := cli.WriteData(cmd.OutOrStdout(), *output, v); err == nil {
					err = werr
				}
			}
			return err
		}
		if kubernetes && req.DryRun {
			return &codedError{exitUsage, errors.New("--dry-run asks the hub's API (--socket/--api-address); it is not available with --kubernetes")}
		}
		if req.Force && !req.DryRun && !yes && !interactive(cmd.InOrStdin()) {
			return &codedError{exitUsage, fmt.Errorf("--force asks you to confirm by typing the machine's name, and stdin is not a terminal: "+
				"add --yes to confirm %s without a prompt (nothing done)", req.Machine)}
		}
		if kubernetes && req.Force && !yes {
			fmt.Fprintf(out, "--force overrides the quorum check; type the machine's name (%s) to go ahead: ", req.Machine)
			line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
			if strings.TrimSpace(line) != req.Machine {
				return &codedError{exitUsage, errors.New("not confirmed: nothing done")}
			}
		}
		if kubernetes {
			obj, err := rebootThroughKubernetes(cmd.Context(), &k, req, wait, out)
			if obj.Name == "" {
				return err
			}
			obj.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Remediation")) // as kubectl prints it
			return emit(obj, err)
		}
		c, err := f.client()
		if err != nil {
			return err
		}
		path := "/v1/machines/" + url.PathEscape(req.Machine) + "/reboot"
		if req.Force && !req.DryRun && !yes {
			dry := req
			dry.DryRun = true
			var res hub.RebootResult
			if err := c.do(cmd.Context(), http.MethodPost, path, dry, &res); err != nil {
				return err
			}
			fmt.Fprintf(out, "plan: %s\n", strings.Join(res.Steps, " → "))
			if res.Overrides != "" {
				fmt.Fprintf(out, "this overrides: %s\n", res.Overrides)
			}
			fmt.Fprintf(out, "type the machine's name (%s) to go ahead: ", req.Machine)
			line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
			if strings.TrimSpace(line) != req.Machine {
				return &codedError{exitUsage, errors.New("not confirmed: nothing done")}
			}
		}
		var res hub.RebootResult
		if err := c.do(cmd.Context(), http.MethodPost, path, req, &res); err != nil {
			return err
		}
		if res.DryRun {
			fmt.Fprintf(out, "dry run: would %s\n", strings.Join(res.Steps, " → "))
			if res.Overrides != "" {
				fmt.Fprintf(out, "only with --force, over: %s\n", res.Overrides)
			}
			return emit(res, nil)
		}
		fmt.Fprintf(out, "remediation %s started: %s\n", res.Remediation, strings.Join(res.Steps, " → "))
		if !wait {
			return emit(res, nil)
		}
		rem, err := waitRemediation(cmd.Context(), c, req.Machine, res.Remediation, out)
		if rem.ID == "" {
			return err
		}
		return emit(rem, err)
	}
	cmd.Flags().BoolVar(&req.Hard, "hard", false, "power-cycle at once instead of a graceful restart first")
	cmd.Flags().BoolVar(&req.DryRun, "dry-run", false, "check and show the plan; change nothing")
	cmd.Flags().BoolVar(&req.Force, "force", false, "go ahead even when the quorum check refuses (asks for confirmation)")
	cmd.Flags().BoolVar(&yes, "yes", false, "with --force: do not ask for confirmation")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the machine is back (or the remediation failed)")
	cmd.Flags().BoolVar(&kubernetes, "kubernetes", false, "request it as a Remediation object (Kubernetes RBAC decides) instead of through the hub's API")
	cmd.Flags().StringVar(&k.kubeconfig, "kubeconfig", "", "with --kubernetes: kubeconfig file (default: in-cluster)")
	cmd.Flags().StringVar(&k.namespace, "namespace", "hale-system", "with --kubernetes: the hub's namespace")
	return cmd
}

// waitRemediation follows the remediation (GET /v1/remediations/ID) until it has ended, prints how it
// ended in one line and returns it, with an error unless it succeeded.
func waitRemediation(ctx context.Context, c *apiClient, machine, id string, out io.Writer) (journal.Remediation, error) {
	var segs []string
	for _, s := range strings.Split(id, "/") {
		segs = append(segs, url.PathEscape(s))
	}
	for {
		var rem journal.Remediation
		if err := c.do(ctx, http.MethodGet, "/v1/remediations/"+strings.Join(segs, "/"), nil, &rem); err != nil {
			return journal.Remediation{}, err
		}
		if rem.State != journal.InProgress {
			fmt.Fprintln(out, endLine(rem))
			if rem.State != journal.Succeeded {
				return rem, &codedError{exitRefused, fmt.Errorf("remediation %s ended %s (hub explain %s: every step)", id, rem.State, machine)}
			}
			return rem, nil
		}
		select {
		case <-ctx.Done():
			return journal.Remediation{}, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// endLine is the one line `reboot --wait` ends with: how the remediation ended, how long it took, and
// its last word (what failed, or how the machine was proven back).
func endLine(rem journal.Remediation) string {
	line := fmt.Sprintf("remediation %s: %s, %s, requested by %s, in %v", rem.ID, rem.State, rem.Strategy, rem.RequestedBy,
		rem.Updated.Sub(rem.Created).Round(100*time.Millisecond))
	if n := len(rem.History); n > 0 && rem.History[n-1].Detail != "" {
		line += ": " + rem.History[n-1].Detail
	}
	return line
}

func printStatus(w io.Writer, st hub.Status, wide bool) {
	fmt.Fprintf(w, "cluster %s · journal epoch %d · %s", st.Cluster, st.Epoch, st.Pause)
	if len(st.PausedBy) > 0 {
		fmt.Fprintf(w, " by %s", hub.DescribeBrakes(st.PausedBy))
	}
	if st.SuspendedBy != nil {
		fmt.Fprintf(w, " · SUSPENDED (observe-only) by %s", st.SuspendedBy)
	}
	fmt.Fprintln(w)
	if st.Degraded != "" {
		fmt.Fprintf(w, "DEGRADED: %s\n", st.Degraded)
	}
	if o := st.Observers; o.Expected > 0 {
		fmt.Fprintf(w, "observers: hears %d of %d expected (%s): %s", len(o.Heard), o.Expected, strings.Join(o.Heard, ", "), st.Acting())
		if len(o.Missing) > 0 {
			fmt.Fprintf(w, "; not heard: %s", strings.Join(o.Missing, ", "))
		}
		fmt.Fprintln(w)
	}
	if st.Budget != nil {
		fmt.Fprintf(w, "etcd: %s\n", st.Budget)
	}
	if st.QuorumLoss != nil {
		fmt.Fprintf(w, "%s\n", st.QuorumLoss)
	}
	fmt.Fprintf(w, "policy: %s\n", st.Policy)
	if st.NotPlanning != "" {
		fmt.Fprintf(w, "not planning: %s\n", st.NotPlanning)
	}
	if st.Holding != "" {
		fmt.Fprintf(w, "holding: %s\n", st.Holding)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "MACHINE\tVERDICT\tSINCE\tETCD\tREMEDIATION\tBMC\tREASONS")
	} else {
		fmt.Fprintln(tw, "MACHINE\tVERDICT\tSINCE\tETCD\tREMEDIATION\tREASONS")
	}
	for _, m := range st.Machines {
		since := "-"
		if !m.Since.IsZero() {
			since = st.Time.Sub(m.Since).Round(time.Second).String()
		}
		etcd := "-"
		if m.Member != "" {
			etcd = fmt.Sprintf("%s %s %s", m.Member, m.Role, m.EtcdHealth)
		}
		rem := "-"
		if r := m.Remediation; r != nil {
			step := "done"
			if r.Step < len(r.Steps) {
				step = r.Steps[r.Step].String()
			}
			rem = fmt.Sprintf("%s: %s (step %d/%d)", r.Strategy, step, min(r.Step+1, len(r.Steps)), len(r.Steps))
		}
		verdict := string(m.Verdict)
		if m.Detached {
			verdict += " (Detached)"
		}
		reasons := strings.Join(m.Reasons, "; ")
		if m.Decision != "" && m.Remediation == nil {
			reasons = strings.TrimPrefix(reasons+"; "+m.Decision, "; ")
		}
		if m.BMCLogin != "" && !strings.Contains(reasons, m.BMCLogin) {
			reasons = strings.TrimPrefix(reasons+"; no BMC login: "+m.BMCLogin, "; ")
		}
		if m.OutOfService != "" {
			reasons = strings.TrimPrefix(reasons+"; Node out of service (tainted): "+m.OutOfService, "; ")
		}
		if m.PlannedWork != "" && !strings.Contains(reasons, m.PlannedWork) {
			reasons = strings.TrimPrefix(reasons+"; planned work: "+m.PlannedWork, "; ")
		}
		if reasons == "" {
			reasons = "-"
		}
		if wide {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, verdict, since, etcd, rem, bmcCell(m.BMC), reasons)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, verdict, since, etcd, rem, reasons)
		}
	}
	_ = tw.Flush()
	var notReady []string
	for _, m := range st.Machines {
		if m.BMC != nil && !m.BMC.Ready {
			notReady = append(notReady, fmt.Sprintf("%s (%s)", m.Name, m.BMC.Problem))
		}
	}
	if len(notReady) > 0 {
		fmt.Fprintf(w, "BMC not ready: %s: Hale could not heal them (`hub explain MACHINE` says why)\n", strings.Join(notReady, ", "))
	}
}

// bmcCell is a machine's BMC readiness in `hub status -o wide`.
func bmcCell(r *pass.BMCReadiness) string {
	switch {
	case r == nil:
		return "-"
	case r.Ready:
		return "ready"
	}
	return string(r.Problem)
}

// interactive says whether in can answer a prompt: a terminal, or (in tests) a reader that is not a
// file. A pipe or /dev/null cannot confirm --force: that needs --yes.
func interactive(in io.Reader) bool {
	f, ok := in.(*os.File)
	return !ok || xterm.IsTerminal(int(f.Fd()))
}
