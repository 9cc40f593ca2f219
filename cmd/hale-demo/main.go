// Command hale-demo runs Hale end to end on this machine with nothing to set up (`hale-demo`: an
// embedded 3-member etcd, simulated machines with real agents and simulated BMCs, the hub), and
// Hale's stateful Redfish simulator on its own (`hale-demo bmc-simulator`). It is the demo's and the
// test lab's binary, apart from the hub and agent that ship: those link none of it.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// newRootCommand is hale-demo with its commands.
func newRootCommand() *cobra.Command {
	root := newDemoCommand()
	root.SilenceUsage, root.SilenceErrors = true, true
	root.AddCommand(newSimulateCommand())
	return root
}

func main() {
	root := newRootCommand()
	if err := root.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "hale-demo:", err)
		os.Exit(1)
	}
}
