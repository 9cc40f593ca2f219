// Package cli is what the hub's and the agent's command lines share, so that both behave alike: the -o
// flag of every command that reads, and the version command.
package cli

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/hale-dev/hale/internal/buildinfo"
)

// The -o flag of a command that reads, as kubectl's: a table for people (wide: more columns), JSON or
// YAML for tools. An unknown format is an error (exit 1), before anything is asked of anyone.
const (
	Table = "table"
	Wide  = "wide"
	JSON  = "json"
	YAML  = "yaml"
)

// OutputFlag adds -o to cmd, with its completion, and returns where its value goes.
func OutputFlag(cmd *cobra.Command) *string {
	o := new(string)
	cmd.Flags().StringVarP(o, "output", "o", Table, "output format: table, wide, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{Table, Wide, JSON, YAML}, cobra.ShellCompDirectiveNoFileComp))
	return o
}

// CheckOutput refuses a format OutputFlag does not know (a usage error: exit 1).
func CheckOutput(o string) error {
	switch o {
	case Table, Wide, JSON, YAML:
		return nil
	}
	return fmt.Errorf("-o %q: want table, wide, json or yaml", o)
}

// WriteData writes v as JSON (indented) or YAML; it reports false for the table formats, which the
// command writes itself.
func WriteData(w io.Writer, o string, v any) (bool, error) {
	switch o {
	case JSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return true, enc.Encode(v)
	case YAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(b)
		return true, err
	}
	return false, nil
}

// VersionCommand is `BINARY version [-o …]`: the build (version, commit, build date, Go, platform),
// the same on the hub and the agent.
func VersionCommand(binary string) *cobra.Command {
	cmd := &cobra.Command{Use: "version", Short: "Print the " + binary + "'s version, commit, build date and Go version", Args: cobra.NoArgs,
		Example: "  " + binary + " version\n  " + binary + " version -o json"}
	output := OutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := CheckOutput(*output); err != nil {
			return err
		}
		i := buildinfo.Get()
		if ok, err := WriteData(cmd.OutOrStdout(), *output, i); ok {
			return err
		}
		_, err := fmt.Fprintln(cmd.OutOrStdout(), binary, i)
		return err
	}
	return cmd
}
