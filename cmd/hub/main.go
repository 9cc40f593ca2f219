// Command hub is Hale's decision maker and its operator tool: `hub run` (the standalone daemon),
// the operator commands that talk to it (status, explain, reboot, pause/resume, suspend/unsuspend,
// detach/attach), `hub plan` (the offline what-if planner) and `hub bmc power` (raw, verified BMC
// power control). The demo and the Redfish simulator are cmd/hale-demo's: nothing of them ships.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/hale-dev/hale/internal/cli"

	"github.com/go-logr/logr"
	"github.com/hale-dev/hale/internal/buildinfo"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	// client-go (leader election, the API client) logs through klog: as JSON lines like the hub's own
	// log, not bare stderr text. klog's logger is process-wide, so it is set here, once, before any
	// client exists (setting it later races with clients already logging).
	// controller-runtime's (the management hub's shared informer cache) likewise.
	logs := slog.NewJSONHandler(os.Stderr, nil)
	klog.SetSlogLogger(slog.New(logs))
	crlog.SetLogger(logr.FromSlogHandler(logs))
	if err := newRootCommand(os.Stdout, os.Stderr).ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "hub:", err)
		os.Exit(exitCode(err))
	}
}

func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "hub",
		Version:       buildinfo.Get().String(),
		Short:         "Hale keeps Kubernetes control planes and their etcd healthy without ever costing quorum",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("hub {{.Version}}\n")
	root.AddCommand(newRunCommand(), newCheckCommand(), newPlanCommand(), newBMCCommand(), newIdentityCommand(), cli.VersionCommand("hub"))
	root.AddCommand(operatorCommands()...)
	return root
}
