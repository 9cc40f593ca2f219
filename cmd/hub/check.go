package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/internal/cli"
)

func newCheckCommand() *cobra.Command {
	var inventory string
	var timeout, requestTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "check --inventory FILE",
		Short: "Check an inventory and every machine's BMC once, before the first `hub run` or in a pipeline",
		Long: `check reads and validates the inventory, then asks every machine's BMC for its power state,
once: does it answer, take the login, have the system, read the power. It changes nothing on any
machine. A running hub makes the same check when it starts and every --bmc-check-interval.

The machines behind one BMC account are checked one after another and, once the account refuses the
login, the others are not tried (BMC accounts lock after a few failed logins); accounts are checked
side by side. A silent BMC costs --bmc-request-timeout twice (one retry), not a minute.

Exit codes: 0 every BMC ready, 1 bad input (flags, the inventory), 2 a BMC not ready.`,
		Example: `  hub check --inventory /etc/hale/inventory.yaml          # before the first hub run
  hub check --inventory inventory.yaml -o json --timeout 30s`,
		Args: cobra.NoArgs,
	}
	output := cli.OutputFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&inventory, "inventory", "", "the inventory FILE to check (YAML, as hub run --inventory) (required)")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "give up on the whole check after this long")
	f.DurationVar(&requestTimeout, "bmc-request-timeout", 10*time.Second, "how long one request to a BMC (Redfish, or one ipmitool call) may take before the BMC is called unreachable")
	// Its first name, which the operator API's commands use for their own requests to the hub.
	f.DurationVar(&requestTimeout, "request-timeout", 10*time.Second, "")
	_ = f.MarkDeprecated("request-timeout", "use --bmc-request-timeout")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := usageErr(cli.CheckOutput(*output)); err != nil {
			return err
		}
		if inventory == "" {
			return usageErr(fmt.Errorf("--inventory is required: the inventory file to check"))
		}
		if timeout <= 0 || requestTimeout <= 0 {
			return usageErr(fmt.Errorf("--timeout %v, --bmc-request-timeout %v: both must be positive", timeout, requestTimeout))
		}
		inv, err := hub.LoadInventory(inventory)
		if err != nil {
			return usageErr(err)
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		defer cancel()
		cfg := hub.Config{BMC: bmc.Options{RequestTimeout: requestTimeout, Retries: 1}}
		rows := checkRows(inv, hub.CheckBMCs(ctx, inv.Machines, cfg.BMCPower))
		if ok, err := cli.WriteData(cmd.OutOrStdout(), *output, rows); ok || err != nil {
			if err == nil {
				err = notReady(rows)
			}
			return err
		}
		printCheck(cmd.OutOrStdout(), inventory, rows, *output == cli.Wide)
		return notReady(rows)
	}
	return cmd
}

// checkRow is one machine of `hub check`.
type checkRow struct {
	Machine  string `json:"machine"`
	Endpoint string `json:"endpoint,omitempty"`
	hub.BMCReadiness
}

func checkRows(inv hub.Inventory, found map[string]hub.BMCReadiness) []checkRow {
	var rows []checkRow
	for _, m := range inv.Machines {
		row := checkRow{Machine: m.Name}
		if m.Endpoint.Driver != "" {
			row.Endpoint, row.BMCReadiness = m.Endpoint.String(), found[m.Name]
		}
		rows = append(rows, row)
	}
	return rows
}

// notReady is the error (exit 2) when a BMC is not ready.
func notReady(rows []checkRow) error {
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

func printCheck(w io.Writer, inventory string, rows []checkRow, wide bool) {
	fmt.Fprintf(w, "inventory %s: valid, %d machines\n", inventory, len(rows))
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
