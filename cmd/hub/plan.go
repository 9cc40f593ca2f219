package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/hale-dev/hale/internal/cli"
	"github.com/hale-dev/hale/quorum"
)

// stateFile is the what-if input of `hub plan`: an etcd membership as Hale would see it, the machines
// with their verdicts, and the policy. Strings rather than quorum's types, so that every bad value is
// reported with the path of its field.
type stateFile struct {
	Policy   policyFile    `json:"policy"`
	Members  []memberFile  `json:"members"`
	Machines []machineFile `json:"machines"`
}

// policyFile is spelled as the inventory's policy and the HealthPolicy's spec are.
type policyFile struct {
	MinFaultTolerance *int    `json:"minFaultTolerance"`
	MaxLearners       *int    `json:"maxLearners"`
	MaxInFlight       *string `json:"maxInFlight"`
	MaxUnhealthy      *string `json:"maxUnhealthy"`
}

type memberFile struct {
	Name       string `json:"name"`
	Learner    bool   `json:"learner"`
	Health     string `json:"health"`
	Disruption string `json:"disruption"`
}

type machineFile struct {
	Name      string       `json:"name"`
	Member    string       `json:"member"`
	Pool      string       `json:"pool"`
	Unhealthy bool         `json:"unhealthy"`
	Since     string       `json:"since"`
	Strategy  string       `json:"strategy"`
	InFlight  bool         `json:"inFlight"`
	Remaining []string     `json:"remaining"`
	Replace   *replaceFile `json:"replace"`
}

type replaceFile struct {
	NewMember string   `json:"newMember"`
	Orders    []string `json:"orders"`
	Join      string   `json:"join"`
}

func newPlanCommand() *cobra.Command {
	var file string
	var output *string
	cmd := &cobra.Command{
		Use:   "plan -f STATE.yaml",
		Short: "What would Hale start now? Plan one pass over a described cluster, offline",
		Long: `plan reads an etcd membership, the machines with their verdicts and a policy from a YAML file,
and prints what one planning pass would start now, in which order and with which quorum-safe steps, and why
every other candidate waits. It touches nothing: use it to try a policy or to check a situation by hand.
See examples/ for the file format.`,
		Example: `  hub plan -f examples/quorum-lost.yaml     # what the hub would do with two of three members dead
  hub plan -f state.yaml -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("plan: -f STATE.yaml is required (see examples/)")
			}
			if err := cli.CheckOutput(*output); err != nil {
				return usageErr(fmt.Errorf("plan: %w", err))
			}
			in, err := loadState(file)
			if err != nil {
				return err
			}
			out, err := quorum.PlanPass(in)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			if *output == cli.JSON || *output == cli.YAML {
				return writePlanData(cmd.OutOrStdout(), *output, out)
			}
			return writePlanText(cmd.OutOrStdout(), out)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "YAML file describing members, machines and policy")
	output = cli.OutputFlag(cmd)
	return cmd
}

// loadState reads and validates a state file; every error names the file and the field.
func loadState(path string) (quorum.Input, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return quorum.Input{}, fmt.Errorf("reading state: %w", err)
	}
	var sf stateFile
	if err := yaml.UnmarshalStrict(raw, &sf); err != nil {
		return quorum.Input{}, fmt.Errorf("%s: %w", path, err)
	}
	in, err := sf.input()
	if err != nil {
		return quorum.Input{}, fmt.Errorf("%s: %w", path, err)
	}
	return in, nil
}

func (sf stateFile) input() (quorum.Input, error) {
	in := quorum.Input{Policy: quorum.DefaultPolicy()}
	if v := sf.Policy.MinFaultTolerance; v != nil {
		in.Policy.MinFaultTolerance = *v
	}
	if v := sf.Policy.MaxLearners; v != nil {
		in.Policy.MaxLearners = *v
	}
	for _, l := range []struct {
		field string
		src   *string
		dst   *quorum.Limit
	}{
		{"policy.maxInFlight", sf.Policy.MaxInFlight, &in.Policy.Pools.MaxInFlight},
		{"policy.maxUnhealthy", sf.Policy.MaxUnhealthy, &in.Policy.Pools.MaxUnhealthy},
	} {
		if l.src == nil {
			continue
		}
		v, err := quorum.ParseLimit(*l.src)
		if err != nil {
			return in, fmt.Errorf("%s: %w", l.field, err)
		}
		*l.dst = v
	}
	if err := in.Policy.Validate(); err != nil {
		return in, fmt.Errorf("policy.%w", err)
	}
	if len(sf.Members) == 0 {
		return in, errors.New("members: none listed; describe the etcd membership (name and health of each member)")
	}
	for i, m := range sf.Members {
		at := fmt.Sprintf("members[%d]", i)
		if m.Name == "" {
			return in, fmt.Errorf("%s.name: missing", at)
		}
		h, err := parseEnum(at+".health", m.Health, "", map[string]quorum.Health{
			"healthy": quorum.Healthy, "unhealthy": quorum.Unhealthy, "unknown": quorum.HealthUnknown})
		if err != nil {
			return in, err
		}
		d, err := parseEnum(at+".disruption", m.Disruption, "none", map[string]quorum.Disruption{
			"none": quorum.NotDisrupted, "in-flight": quorum.InFlight, "fenced": quorum.Fenced})
		if err != nil {
			return in, err
		}
		in.Cluster.Members = append(in.Cluster.Members, quorum.Member{Name: m.Name, Learner: m.Learner, Health: h, Disruption: d})
	}
	for i, m := range sf.Machines {
		at := fmt.Sprintf("machines[%d]", i)
		s, err := parseEnum(at+".strategy", m.Strategy, "reboot", map[string]quorum.Strategy{
			"reboot": quorum.Reboot, "fence": quorum.Fence, "replace": quorum.Replace})
		if err != nil {
			return in, err
		}
		mc := quorum.Machine{Name: m.Name, Member: m.Member, Pool: m.Pool, Unhealthy: m.Unhealthy, Strategy: s, InFlight: m.InFlight}
		if m.Since != "" {
			if mc.Since, err = time.Parse(time.RFC3339, m.Since); err != nil {
				return in, fmt.Errorf("%s.since: %q is not an RFC 3339 time like 2026-11-22T03:00:00Z", at, m.Since)
			}
		}
		if len(m.Remaining) > 0 && !m.InFlight {
			return in, fmt.Errorf("%s.remaining: only a machine with inFlight: true has steps still to come", at)
		}
		for j, text := range m.Remaining {
			step, err := quorum.ParseStep(text)
			if err != nil {
				return in, fmt.Errorf("%s.remaining[%d]: %w", at, j, err)
			}
			mc.Remaining = append(mc.Remaining, step)
		}
		if s == quorum.Replace {
			if m.Replace == nil || m.Replace.NewMember == "" {
				return in, fmt.Errorf("%s.replace.newMember: a replace needs the new member's name", at)
			}
			mc.Replace.NewMember = m.Replace.NewMember
			for j, o := range m.Replace.Orders {
				order, err := parseEnum(fmt.Sprintf("%s.replace.orders[%d]", at, j), o, "", map[string]quorum.Order{
					"scale-up-first": quorum.ScaleUpFirst, "scale-down-first": quorum.ScaleDownFirst})
				if err != nil {
					return in, err
				}
				mc.Replace.Orders = append(mc.Replace.Orders, order)
			}
			if mc.Replace.Join, err = parseEnum(at+".replace.join", m.Replace.Join, "learner", map[string]quorum.Join{
				"learner": quorum.JoinAsLearner, "voter": quorum.JoinAsVoter}); err != nil {
				return in, err
			}
		}
		in.Machines = append(in.Machines, mc)
	}
	return in, nil
}

// parseEnum maps s (or def when s is empty) through allowed, naming the field and the choices on error.
func parseEnum[T any](field, s, def string, allowed map[string]T) (T, error) {
	if s == "" {
		s = def
	}
	v, ok := allowed[s]
	if !ok {
		var zero T
		choices := make([]string, 0, len(allowed))
		for k := range allowed {
			choices = append(choices, k)
		}
		slices.Sort(choices)
		if s == "" {
			return zero, fmt.Errorf("%s: missing; want one of %v", field, choices)
		}
		return zero, fmt.Errorf("%s: %q is not one of %v", field, s, choices)
	}
	return v, nil
}

func decisionWord(d quorum.Decision) string {
	switch {
	case d.InFlight:
		return "in-flight"
	case d.Start:
		return "start"
	}
	return "wait"
}

func writePlanText(w io.Writer, out quorum.Outcome) error {
	fmt.Fprintf(w, "etcd now:        %v\n", out.Budget)
	fmt.Fprintf(w, "with this pass:  %v\n\n", out.After)
	if len(out.Decisions) == 0 {
		_, err := fmt.Fprintln(w, "no machine is unhealthy or being remediated: nothing to do")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MACHINE\tMEMBER\tSTRATEGY\tDECISION\tREASON")
	for _, d := range out.Decisions {
		member := d.Member
		if member == "" {
			member = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Machine, member, d.Strategy, decisionWord(d), d.Reason)
		if d.Start && len(d.Plan.Steps) > 0 {
			fmt.Fprintf(tw, "\t\t\t\tsteps: %s\n", d.Plan.StepList())
		}
	}
	return tw.Flush()
}

type decisionJSON struct {
	Machine  string   `json:"machine"`
	Member   string   `json:"member,omitempty"`
	Pool     string   `json:"pool,omitempty"`
	Strategy string   `json:"strategy"`
	Decision string   `json:"decision"`
	Reason   string   `json:"reason"`
	Steps    []string `json:"steps,omitempty"`
	Cost     int      `json:"cost"`
}

func writePlanData(w io.Writer, format string, out quorum.Outcome) error {
	doc := struct {
		Budget    quorum.Budget  `json:"budget"`
		After     quorum.Budget  `json:"after"`
		Decisions []decisionJSON `json:"decisions"`
	}{Budget: out.Budget, After: out.After, Decisions: []decisionJSON{}}
	for _, d := range out.Decisions {
		dj := decisionJSON{Machine: d.Machine, Member: d.Member, Pool: d.Pool, Strategy: d.Strategy.String(),
			Decision: decisionWord(d), Reason: d.Reason, Cost: d.Plan.Cost}
		if len(d.Plan.Steps) > 0 {
			dj.Steps = d.Plan.StepStrings()
		}
		doc.Decisions = append(doc.Decisions, dj)
	}
	_, err := cli.WriteData(w, format, doc)
	return err
}
