// Package degraded holds degraded mode's rules: when a Kubernetes-mode leader that lost the API server
// may act alone, for how long, and what it acts with (its term, its inventory, its brakes).
// kube.Degraded runs the terms (kube/degraded.go); everything here is pure but the term file and
// ImportBrakes.
//
// Degraded mode: Kubernetes mode when etcd has lost quorum. The API server cannot answer, so the
// Lease cannot be renewed and the Remediation objects cannot be written; every Kubernetes-native
// healer is blind. The leader that was goes on alone, with a local journal and the break-glass
// inventory's BMCs, and only where etcd's rules make it free (the planner's, unchanged: with quorum
// lost it power-cycles members a majority of observers sees dead, and disrupts no healthy voter).
//
// Why no two replicas act (docs/design.md, "Quorum lost in Kubernetes mode"):
//   - A leader enters degraded mode only while its own lease still holds by its clock (less than a
//     lease duration, minus half a retry period, after its last renewal) and only when a strict
//     majority of the expected observers shows etcd's quorum lost. No other replica can have taken
//     the Lease by then (a standby takes it a lease duration after the last renewal at the earliest),
//     and none can take it afterwards: writing the Lease needs etcd's quorum.
//   - When quorum and the API server come back, a standby takes the Lease of another holder only once
//     the API server has answered with it unchanged for a lease duration (kube.Elect's patientLock);
//     the degraded leader probes every retry period, stops at the first answer and renews the Lease as
//     the same identity, at the same epoch, long before.
//   - Once a pass of the degraded hub sees etcd's quorum again, it starts nothing new: a degraded
//     leader that cannot reach the API server after quorum is back (its own partition) must not race a
//     standby that can. What it had begun goes on (said in docs/design.md).
//   - The degraded term's authority lasts as long from the last time the API server failed to answer
//     it; every failed probe renews it, and it is written to the term file beside the journal. A hub
//     restarted in the same pod (same volume) continues the term only while that authority lasts;
//     later it waits for the API server like any replica.

package degraded

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// Lease is the Kubernetes-mode Lease's timing that degraded mode's authority is bounded by.
type Lease struct {
	Duration time.Duration
}

// Retry is how often a degraded hub asks the API server whether it answers again.
func (l Lease) Retry() time.Duration { return l.Duration / 10 }

// Authority bounds a leader's own lease by its clock (a standby takes it a lease duration after the
// last renewal at the earliest; half a retry period is left for clocks and round trips), and a
// degraded term after the API server last failed to answer.
func (l Lease) Authority() time.Duration { return l.Duration - l.Retry()/2 }

// Loss is what a leader that lost its Lease without giving it up knows when it decides whether to
// act alone.
type Loss struct {
	// Quorum and QuorumWhy: etcd's quorum as its hub's latest pass saw it (hub.Hub.EtcdQuorum).
	Quorum    pass.EtcdQuorum
	QuorumWhy string
	// APIAnswers: the API server answered a read of the Lease just now.
	APIAnswers bool
	// Renewed is when this leader last renewed its Lease (zero: never); Now is after the API probe.
	Renewed, Now time.Time
}

// Enter says whether a leader that lost its Lease without giving it up runs a degraded term, and
// why not: only with etcd's quorum lost as a strict majority of observers sees it, the API server
// silent, and its own lease still its own by its clock (decided after the probe, so that no standby
// can have taken the Lease by then).
func (l Lease) Enter(s Loss) (bool, string) {
	switch held := s.Now.Sub(s.Renewed); {
	case s.Quorum != pass.QuorumLost:
		return false, "not entering degraded mode: " + s.QuorumWhy
	case s.APIAnswers:
		return false, "the API server answers: deposed, or it is back: campaigning again"
	case s.Renewed.IsZero() || held > l.Authority():
		return false, fmt.Sprintf("quorum lost, but the lease was last renewed %v ago, more than this leader's authority (%v): another replica may hold it",
			held.Round(time.Millisecond), l.Authority())
	}
	return true, ""
}

// Continue says whether a hub continues the degraded term a hub of its pod left (t, from the term
// file): only while the API server still does not answer and the term's authority lasts.
func (l Lease) Continue(t Term, apiAnswers bool, now time.Time) (bool, string) {
	switch ago := now.Sub(t.Unreachable); {
	case apiAnswers:
		return false, "a degraded term was left unfinished; the API server answers: its journal is imported once this replica leads"
	case ago > l.Authority():
		return false, fmt.Sprintf("a degraded term was left unfinished and its authority has lapsed (the API server last failed to answer %v ago): "+
			"waiting for the API server like any replica", ago.Round(time.Second))
	}
	return true, ""
}

// Standby says why a degraded hub starts nothing new ("" when it may): its authority lapsed since the
// API server last failed to answer it, or a pass saw etcd's quorum again (quorumBack: what it saw; a
// degraded leader that cannot reach the API server once quorum is back, its own partition, must not
// race a standby that can).
func (l Lease) Standby(unreachable, now time.Time, quorumBack string) string {
	if ago := now.Sub(unreachable); ago > l.Authority() {
		return fmt.Sprintf("degraded mode: the API server last failed to answer %v ago, longer than this term's authority (%v): another replica may lead",
			ago.Round(time.Millisecond), l.Authority())
	}
	if quorumBack != "" {
		return "degraded mode: etcd has quorum again (" + quorumBack + "): nothing new starts until the API server answers this hub (a replica that reaches it leads after a lease duration)"
	}
	return ""
}

// Term is the term file beside the local journal: whose term it is, and since when the API
// server has not answered. A hub that finds one continues that term (same identity, same epoch).
type Term struct {
	Identity string    `json:"identity"`
	Epoch    uint64    `json:"epoch"`
	Since    time.Time `json:"since"`
	Why      string    `json:"why"`
	// Unreachable is when the API server last failed to answer: the term's authority lasts a lease
	// duration minus a retry period from then.
	Unreachable time.Time `json:"unreachable"`
	// Machines and Witnesses are the term's inventory (the last leader's: discovered, in general),
	// for a hub that continues the term without the API server to discover it again.
	Machines  []TermMachine `json:"machines"`
	Witnesses []string      `json:"witnesses,omitempty"`
}

// TermMachine is a machine of the term's inventory, without its way to be healed (the break-glass
// inventory gives that).
type TermMachine struct {
	Name   string `json:"name"`
	Node   string `json:"node"`
	Member string `json:"member,omitempty"`
	Class  string `json:"class,omitempty"`
	Pool   string `json:"pool,omitempty"`
	Hold   string `json:"hold,omitempty"`
}

// Inventory is a degraded term's inventory: the machines and witnesses of the term before it
// (the expected observers stay the same), each machine with its BMC from the break-glass inventory and
// healed by power (no owner is within reach). A machine the break-glass inventory does not list is
// held; so is every machine without one (PowerFor says why), and a machine held before stays held.
func Inventory(last pass.Inventory, breakGlass *pass.Inventory) pass.Inventory {
	inv := last
	inv.Machines = nil
	for _, m := range last.Machines {
		m.Replace = quorum.ReplaceOptions{}
		if breakGlass != nil {
			i := slices.IndexFunc(breakGlass.Machines, func(b pass.Machine) bool { return b.Name == m.Name })
			if i < 0 {
				m.Hold = cmp.Or(m.Hold, "not in the break-glass inventory: no BMC within reach while the API server does not answer")
			} else {
				b := breakGlass.Machines[i]
				m.Endpoint, m.Credentials, m.CAFile, m.Insecure, m.Strategy = b.Endpoint, b.Credentials, b.CAFile, b.Insecure, b.Strategy
				m.Member = cmp.Or(m.Member, b.Member)
			}
		}
		inv.Machines = append(inv.Machines, m)
	}
	return inv
}

// TermInventory is the inventory a continued term starts from: base's cluster and policy (the
// inventory file) with the term's machines and witnesses.
func TermInventory(base pass.Inventory, t Term) pass.Inventory {
	inv := pass.Inventory{Cluster: base.Cluster, Policy: base.Policy, Witnesses: t.Witnesses}
	for _, m := range t.Machines {
		inv.Machines = append(inv.Machines, pass.Machine{MachineRef: assess.MachineRef{Name: m.Name, Node: m.Node, Member: m.Member},
			Class: m.Class, Pool: m.Pool, Hold: m.Hold, Strategy: quorum.Reboot})
	}
	return inv
}

// TermPath is the term file beside a local journal.
func TermPath(journal string) string { return journal + ".term" }

// ReadTerm reads the term file; nil when there is none.
func ReadTerm(journal string) (*Term, error) {
	b, err := os.ReadFile(TermPath(journal))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("degraded mode's term file: %w", err)
	}
	var t Term
	if err := json.Unmarshal(b, &t); err != nil || t.Identity == "" {
		return nil, fmt.Errorf("degraded mode's term file %s is unreadable (%v): move it aside after checking the journal %s beside it",
			TermPath(journal), err, journal)
	}
	return &t, nil
}

// WriteTerm replaces the term file atomically.
func WriteTerm(journal string, t Term) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	tmp := TermPath(journal) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("degraded mode's term file: %w", err)
	}
	return os.Rename(tmp, TermPath(journal))
}

// NewTerm is the term a leader begins at now: its identity and epoch, why, and its hub's inventory.
func NewTerm(identity string, epoch uint64, now time.Time, why string, inv pass.Inventory) Term {
	t := Term{Identity: identity, Epoch: epoch, Since: now, Why: why, Unreachable: now, Witnesses: inv.Witnesses}
	for _, m := range inv.Machines {
		t.Machines = append(t.Machines, TermMachine{Name: m.Name, Node: m.Node, Member: m.Member, Class: m.Class, Pool: m.Pool, Hold: m.Hold})
	}
	return t
}

// SnapshotBrakes are the brakes in force in st, for the degraded term: every pause (the operator's
// and a Cluster API Cluster's) as one, the suspend, the detached machines, and the machines with a
// remediation in flight through the API server, detached until it answers.
func SnapshotBrakes(st operator.Status) *pass.Brakes {
	b := &pass.Brakes{Suspended: st.SuspendedBy, Detached: map[string]pass.Brake{}}
	if len(st.PausedBy) > 0 {
		b.Paused = &pass.Brake{By: st.PausedBy[0].By, Reason: hub.DescribeBrakes(st.PausedBy), Since: st.PausedBy[0].Since}
	}
	for _, m := range st.Machines {
		switch {
		case m.DetachedBy != nil:
			b.Detached[m.Name] = *m.DetachedBy
		case m.Remediation != nil:
			b.Detached[m.Name] = pass.Brake{By: "hale", Since: st.Time, Reason: fmt.Sprintf("remediation %s (%s), begun through the API server, is in flight: held until the API server answers",
				m.Remediation.ID, m.Remediation.Strategy)}
		}
	}
	return b
}
