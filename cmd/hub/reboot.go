package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/internal/cli"
)

func newRebootCommand(f *apiFlags) *cobra.Command {
	var req operator.RebootRequest
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
			var res operator.RebootResult
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
		var res operator.RebootResult
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
