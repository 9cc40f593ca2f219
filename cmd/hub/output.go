package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// The -o flag of a command that reads, as kubectl's: a table for people (wide: more columns), JSON or
// YAML for tools. An unknown format is an error (exit 1), before anything is asked of anyone.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
	outYAML  = "yaml"
)

// outputFlag adds -o to cmd, with its completion, and returns where its value goes.
func outputFlag(cmd *cobra.Command) *string {
	o := new(string)
	cmd.Flags().StringVarP(o, "output", "o", outTable, "output format: table, wide, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{outTable, outWide, outJSON, outYAML}, cobra.ShellCompDirectiveNoFileComp))
	return o
}

// checkOutput refuses a format outputFlag does not know.
func checkOutput(o string) error {
	switch o {
	case outTable, outWide, outJSON, outYAML:
		return nil
	}
	return &codedError{exitUsage, fmt.Errorf("-o %q: want table, wide, json or yaml", o)}
}

// writeData writes v as JSON (indented) or YAML; it reports false for the table formats, which the
// command writes itself.
func writeData(w io.Writer, o string, v any) (bool, error) {
	switch o {
	case outJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return true, enc.Encode(v)
	case outYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(b)
		return true, err
	}
	return false, nil
}
