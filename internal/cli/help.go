package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// HelpProblems walks root and every command under it and says where the help would read wrong: a
// flag's usage with backquotes in it (pflag takes the first backquoted words for the flag's value
// name, so "as `hub run --inventory`" printed as "--inventory hub run --inventory"), or a flag with
// no usage at all (a deprecated one excepted: it is hidden).
func HelpProblems(root *cobra.Command) []string {
	var out []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			switch {
			case f.Deprecated != "" || f.Hidden:
			case strings.Contains(f.Usage, "`"):
				name, _ := pflag.UnquoteUsage(f)
				out = append(out, fmt.Sprintf("%s --%s: its usage has backquotes, so its value is shown as %q", c.CommandPath(), f.Name, name))
			case strings.TrimSpace(f.Usage) == "":
				out = append(out, fmt.Sprintf("%s --%s: no usage", c.CommandPath(), f.Name))
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return out
}
