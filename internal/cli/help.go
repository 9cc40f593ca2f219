package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// HelpProblems walks root and every command under it and says where the help would read wrong: a
// flag's usage with backquotes in it (pflag takes the first backquoted words for the flag's value
// name, so "as `hub run --inventory`" printed as "--inventory hub run --inventory"), a flag with no
// usage at all (a deprecated one excepted: it is hidden), a command that runs and has no Examples,
// or an example that gives the command a flag it does not have.
func HelpProblems(root *cobra.Command) []string {
	var out []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() && !c.Hidden && c.Name() != "help" && c.Name() != "completion" {
			if strings.TrimSpace(c.Example) == "" {
				out = append(out, c.CommandPath()+": no examples")
			}
			out = append(out, exampleProblems(c)...)
		}
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

// exampleProblems are the flags c's examples give c that it does not know. An example line is the
// command's path followed by its arguments (a "#" starts a comment; lines of other commands, such as
// a pipe's second half, are not checked past the pipe).
func exampleProblems(c *cobra.Command) []string {
	var out []string
	path := c.CommandPath()
	c.InitDefaultHelpFlag()
	flags := pflag.NewFlagSet(path, pflag.ContinueOnError)
	flags.AddFlagSet(c.Flags())
	flags.AddFlagSet(c.InheritedFlags())
	for _, line := range strings.Split(c.Example, "\n") {
		line, _, _ = strings.Cut(line, "#")
		line, _, _ = strings.Cut(line, "|")
		line, _, _ = strings.Cut(line, ">")
		line = strings.TrimSpace(line)
		if line != path && !strings.HasPrefix(line, path+" ") {
			continue
		}
		for _, w := range strings.Fields(strings.TrimPrefix(line, path)) {
			if !strings.HasPrefix(w, "-") || w == "-" || w == "--" {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
			var f *pflag.Flag
			if strings.HasPrefix(w, "--") {
				f = flags.Lookup(name)
			} else if len(name) == 1 {
				f = flags.ShorthandLookup(name)
			}
			if f == nil {
				out = append(out, fmt.Sprintf("%s: its example %q gives it %s, which it does not have", path, line, w))
			}
		}
	}
	return out
}
