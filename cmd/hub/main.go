// Command hub is Hale's decision maker and its operator tool. This build carries `hub plan` (the
// offline what-if planner) and `hub bmc` (raw, verified BMC power control and a Redfish simulator);
// the daemon (`hub run`) and the quorum-checked operator commands land with the hub.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRootCommand(os.Stdout, os.Stderr).ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "hub:", err)
		os.Exit(exitCode(err))
	}
}

func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "hub",
		Short:         "Hale keeps Kubernetes control planes and their etcd healthy without ever costing quorum",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newPlanCommand(), newBMCCommand())
	return root
}
