package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
)

func printStatus(w io.Writer, st operator.Status, wide bool) {
	fmt.Fprintf(w, "cluster %s · journal epoch %d · %s", st.Cluster, st.Epoch, st.Pause)
	if len(st.PausedBy) > 0 {
		fmt.Fprintf(w, " by %s", hub.DescribeBrakes(st.PausedBy))
	}
	if st.SuspendedBy != nil {
		fmt.Fprintf(w, " · SUSPENDED (observe-only) by %s", st.SuspendedBy)
	}
	fmt.Fprintln(w)
	if st.Degraded != "" {
		fmt.Fprintf(w, "DEGRADED: %s\n", st.Degraded)
	}
	if o := st.Observers; o.Expected > 0 {
		fmt.Fprintf(w, "observers: hears %d of %d expected (%s): %s", len(o.Heard), o.Expected, strings.Join(o.Heard, ", "), st.Acting())
		if len(o.Missing) > 0 {
			fmt.Fprintf(w, "; not heard: %s", strings.Join(o.Missing, ", "))
		}
		fmt.Fprintln(w)
	}
	if st.Budget != nil {
		fmt.Fprintf(w, "etcd: %s\n", st.Budget)
	}
	if st.QuorumLoss != nil {
		fmt.Fprintf(w, "%s\n", st.QuorumLoss)
	}
	fmt.Fprintf(w, "policy: %s\n", st.Policy)
	if st.NotPlanning != "" {
		fmt.Fprintf(w, "not planning: %s\n", st.NotPlanning)
	}
	if st.Holding != "" {
		fmt.Fprintf(w, "holding: %s\n", st.Holding)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "MACHINE\tVERDICT\tSINCE\tETCD\tREMEDIATION\tBMC\tREASONS")
	} else {
		fmt.Fprintln(tw, "MACHINE\tVERDICT\tSINCE\tETCD\tREMEDIATION\tREASONS")
	}
	for _, m := range st.Machines {
		since := "-"
		if !m.Since.IsZero() {
			since = st.Time.Sub(m.Since).Round(time.Second).String()
		}
		etcd := "-"
		if m.Member != "" {
			etcd = fmt.Sprintf("%s %s %s", m.Member, m.Role, m.EtcdHealth)
		}
		rem := "-"
		if r := m.Remediation; r != nil {
			step := "done"
			if r.Step < len(r.Steps) {
				step = r.Steps[r.Step].String()
			}
			rem = fmt.Sprintf("%s: %s (step %d/%d)", r.Strategy, step, min(r.Step+1, len(r.Steps)), len(r.Steps))
		}
		verdict := string(m.Verdict)
		if m.Detached {
			verdict += " (Detached)"
		}
		reasons := strings.Join(m.Reasons, "; ")
		if m.Decision != "" && m.Remediation == nil {
			reasons = strings.TrimPrefix(reasons+"; "+m.Decision, "; ")
		}
		if m.BMCLogin != "" && !strings.Contains(reasons, m.BMCLogin) {
			reasons = strings.TrimPrefix(reasons+"; no BMC login: "+m.BMCLogin, "; ")
		}
		if m.OutOfService != "" {
			reasons = strings.TrimPrefix(reasons+"; Node out of service (tainted): "+m.OutOfService, "; ")
		}
		if m.PlannedWork != "" && !strings.Contains(reasons, m.PlannedWork) {
			reasons = strings.TrimPrefix(reasons+"; planned work: "+m.PlannedWork, "; ")
		}
		if reasons == "" {
			reasons = "-"
		}
		if wide {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, verdict, since, etcd, rem, bmcCell(m.BMC), reasons)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, verdict, since, etcd, rem, reasons)
		}
	}
	_ = tw.Flush()
	var notReady []string
	for _, m := range st.Machines {
		if m.BMC != nil && !m.BMC.Ready {
			notReady = append(notReady, fmt.Sprintf("%s (%s)", m.Name, m.BMC.Problem))
		}
	}
	if len(notReady) > 0 {
		fmt.Fprintf(w, "BMC not ready: %s: Hale could not heal them (`hub explain MACHINE` says why)\n", strings.Join(notReady, ", "))
	}
}

// bmcCell is a machine's BMC readiness in `hub status -o wide`.
func bmcCell(r *pass.BMCReadiness) string {
	switch {
	case r == nil:
		return "-"
	case r.Ready:
		return "ready"
	}
	return string(r.Problem)
}
