package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/bmcaccess"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/internal/cli"
)

func newCheckCommand() *cobra.Command {
	var inventoryPath string
	var timeout, requestTimeout time.Duration
	var now bool
	var api apiFlags
	cmd := &cobra.Command{
		Use:   "check --inventory FILE | --now",
		Short: "Check an inventory and every machine's BMC once, before the first `hub run` or in a pipeline",
		Long: `check reads and validates the inventory, then asks every machine's BMC for its power state,
once: does it answer, take the login, have the system, read the power. It changes nothing on any
machine. A running hub makes the same check when it starts and every --bmc-check-interval.

The machines behind one BMC account are checked one after another and, once the account refuses the
login, the others are not tried (BMC accounts lock after a few failed logins); accounts are checked
side by side. A silent BMC costs --bmc-request-timeout twice (one retry), not a minute.

With --now, the running hub makes its check at once (over --socket, or --api-address) instead of at
its next --bmc-check-interval, records what it finds (hub status shows it) and prints it: after a BMC's
password or network was fixed. An account whose login was refused is tried once more then, though the
hub would otherwise wait before its next login (BMC accounts lock after a few failed logins).

Exit codes: 0 every BMC ready, 1 bad input (flags, the inventory), 2 a BMC not ready, 4 (--now) the
hub could not be reached.`,
		Example: `  hub check --inventory /etc/hale/inventory.yaml          # before the first hub run
  hub check --inventory inventory.yaml -o json --timeout 30s
  hub check --now                                         # the running hub checks its BMCs now`,
		Args: cobra.NoArgs,
	}
	output := cli.OutputFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&inventoryPath, "inventory", "", "the inventory FILE to check (YAML, as hub run --inventory); or --now")
	f.BoolVar(&now, "now", false, "have the running hub check its BMCs at once, and print what it found")
	api.registerWhere(f)
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "give up on the whole check after this long")
	f.DurationVar(&requestTimeout, "bmc-request-timeout", 10*time.Second, "how long one request to a BMC (Redfish, or one ipmitool call) may take before the BMC is called unreachable")
	// Its first name, which the operator API's commands use for their own requests to the hub.
	f.DurationVar(&requestTimeout, "request-timeout", 10*time.Second, "")
	_ = f.MarkDeprecated("request-timeout", "use --bmc-request-timeout")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := usageErr(cli.CheckOutput(*output)); err != nil {
			return err
		}
		switch {
		case inventoryPath == "" && !now:
			return usageErr(fmt.Errorf("--inventory is required: the inventory file to check (or --now: the running hub checks its own)"))
		case inventoryPath != "" && now:
			return usageErr(fmt.Errorf("--inventory and --now: give one (--now checks the running hub's inventory)"))
		case timeout <= 0 || requestTimeout <= 0:
			return usageErr(fmt.Errorf("--timeout %v, --bmc-request-timeout %v: both must be positive", timeout, requestTimeout))
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		defer cancel()
		var rows []bmcaccess.BMCCheck
		title := "inventory " + inventoryPath + ": valid"
		if now {
			api.timeout = timeout
			c, err := api.client()
			if err != nil {
				return usageErr(err)
			}
			if err := c.do(ctx, http.MethodPost, "/v1/bmc-check", nil, &rows); err != nil {
				return err
			}
			title = "the hub at " + c.where + ", checked now"
		} else {
			inv, err := inventory.Load(inventoryPath)
			if err != nil {
				return usageErr(err)
			}
			cfg := hub.Config{BMC: bmc.Options{RequestTimeout: requestTimeout, Retries: 1}}
			rows = bmcaccess.BMCChecks(inv, bmcaccess.CheckBMCs(ctx, inv.Machines, cfg.BMCPower))
		}
		if ok, err := cli.WriteData(cmd.OutOrStdout(), *output, rows); ok || err != nil {
			if err == nil {
				err = notReady(rows)
			}
			return err
		}
		printCheck(cmd.OutOrStdout(), title, rows, *output == cli.Wide)
		return notReady(rows)
	}
	return cmd
}

// notReady is the error (exit 2) when a BMC is not ready.
func notReady(rows []bmcaccess.BMCCheck) error {
	var bad []string
	for _, r := range rows {
		if r.Endpoint != "" && !r.Ready {
			bad = append(bad, r.Machine)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return &codedError{exitBMCFailed, fmt.Errorf("%d of %d BMCs not ready: %s", len(bad), len(rows), strings.Join(bad, ", "))}
}

func printCheck(w io.Writer, title string, rows []bmcaccess.BMCCheck, wide bool) {
	fmt.Fprintf(w, "%s, %d machines\n", title, len(rows))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "MACHINE\tBMC\tREADY\tPOWER\tPROBLEM"
	if wide {
		header += "\tERROR"
	}
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		ready, power, problem := "yes", string(r.Power), "-"
		switch {
		case r.Endpoint == "":
			r.Endpoint, ready, power = "(none)", "-", "-"
		case !r.Ready:
			ready, power, problem = "NO", "-", string(r.Problem)
		}
		line := strings.Join([]string{r.Machine, r.Endpoint, ready, power, problem}, "\t")
		if wide {
			line += "\t" + cmp.Or(r.Error, "-")
		}
		fmt.Fprintln(tw, line)
	}
	_ = tw.Flush()
	if !wide {
		for _, r := range rows {
			if r.Endpoint != "" && !r.Ready {
				fmt.Fprintf(w, "%s: %s\n", r.Machine, r.Error)
			}
		}
	}
}
