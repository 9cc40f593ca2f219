package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/health/identity"
)

// newIdentityCommand prints the hub's line for the pinned-keys file, creating its key when missing.
func newIdentityCommand() *cobra.Command {
	var file, node string
	cmd := &cobra.Command{
		Use:   "identity --identity-file FILE",
		Short: "Print the hub's line for the pinned-keys file (its key is created when missing)",
		Long: `Print the hub's line for the pinned-keys file every agent and hub reads (--pinned-file):
"hub-* ed25519:..." (the hub takes a new name at every start; with --node, that name). The key is
created (mode 0600) when the file does not exist.`,
		Example: `  hub identity --identity-file /var/lib/hale-hub/identity.key >> pinned-keys   # then give every agent and hub that file`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("--identity-file is required")
			}
			id, _, err := identity.LoadOrCreateIdentity(file)
			if err != nil {
				return err
			}
			name := node
			if name == "" {
				name = "hub-*"
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), name, id.Public())
			return err
		},
	}
	cmd.Flags().StringVar(&file, "identity-file", "", "the hub's signing key FILE, as given to hub run (required)")
	cmd.Flags().StringVar(&node, "node", "", "the hub's NAME, when hub run is given one (--node)")
	return cmd
}
