package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/kube"
	"github.com/hale-dev/hale/quorum"
)

// Degraded mode: Kubernetes mode when etcd has lost quorum. The API server cannot answer, so the
// Lease cannot be renewed and the Remediation objects cannot be written; every Kubernetes-native
// healer is blind. The leader that was goes on alone, with a local journal and the break-glass
// inventory's BMCs, and only where etcd's rules make it free (the planner's, unchanged: with quorum
// lost it power-cycles members a majority of observers sees dead, and disrupts no healthy voter).
//
// Why no two replicas act (README, "Quorum lost in Kubernetes mode"):
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
//     standby that can. What it had begun goes on (said in the README).
//   - The degraded term's authority lasts as long from the last time the API server failed to answer
//     it; every failed probe renews it, and it is written to the term file beside the journal. A hub
//     restarted in the same pod (same volume) continues the term only while that authority lasts;
//     later it waits for the API server like any replica.

// degradedTerm is the term file beside the local journal: whose term it is, and since when the API
// server has not answered. A hub that finds one continues that term (same identity, same epoch).
type degradedTerm struct {
	Identity string    `json:"identity"`
	Epoch    uint64    `json:"epoch"`
	Since    time.Time `json:"since"`
	Why      string    `json:"why"`
	// Unreachable is when the API server last failed to answer: the term's authority lasts a lease
	// duration minus a retry period from then.
	Unreachable time.Time `json:"unreachable"`
	// Machines and Witnesses are the term's inventory (the last leader's: discovered, in general),
	// for a hub that continues the term without the API server to discover it again.
	Machines  []termMachine `json:"machines"`
	Witnesses []string      `json:"witnesses,omitempty"`
}

// termMachine is a machine of the term's inventory, without its way to be healed (the break-glass
// inventory gives that).
type termMachine struct {
	Name   string `json:"name"`
	Node   string `json:"node"`
	Member string `json:"member,omitempty"`
	Class  string `json:"class,omitempty"`
	Pool   string `json:"pool,omitempty"`
	Hold   string `json:"hold,omitempty"`
}

// degradedInventory is a degraded term's inventory: the machines and witnesses of the term before it
// (the expected observers stay the same), each machine with its BMC from the break-glass inventory and
// healed by power (no owner is within reach). A machine the break-glass inventory does not list is
// held; so is every machine without one (PowerFor says why), and a machine held before stays held.
func degradedInventory(last hub.Inventory, breakGlass *hub.Inventory) hub.Inventory {
	inv := last
	inv.Machines = nil
	for _, m := range last.Machines {
		m.Replace = quorum.ReplaceOptions{}
		if breakGlass != nil {
			i := slices.IndexFunc(breakGlass.Machines, func(b hub.Machine) bool { return b.Name == m.Name })
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

// termInventory is the inventory a continued term starts from: base's cluster and policy (the
// inventory file) with the term's machines and witnesses.
func termInventory(base hub.Inventory, t degradedTerm) hub.Inventory {
	inv := hub.Inventory{Cluster: base.Cluster, Policy: base.Policy, Witnesses: t.Witnesses}
	for _, m := range t.Machines {
		inv.Machines = append(inv.Machines, hub.Machine{MachineRef: hub.MachineRef{Name: m.Name, Node: m.Node, Member: m.Member},
			Class: m.Class, Pool: m.Pool, Hold: m.Hold, Strategy: quorum.Reboot})
	}
	return inv
}

func termPath(journal string) string { return journal + ".term" }

// readTerm reads the term file; nil when there is none.
func readTerm(journal string) (*degradedTerm, error) {
	b, err := os.ReadFile(termPath(journal))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("degraded mode's term file: %w", err)
	}
	var t degradedTerm
	if err := json.Unmarshal(b, &t); err != nil || t.Identity == "" {
		return nil, fmt.Errorf("degraded mode's term file %s is unreadable (%v): move it aside after checking the journal %s beside it",
			termPath(journal), err, journal)
	}
	return &t, nil
}

// writeTerm replaces the term file atomically.
func writeTerm(journal string, t degradedTerm) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	tmp := termPath(journal) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("degraded mode's term file: %w", err)
	}
	return os.Rename(tmp, termPath(journal))
}

// degraded runs degraded terms for runLeading.
type degraded struct {
	o      runOptions
	k      *kubeOptions
	log    *slog.Logger
	c      client.Client
	newHub func(hub.Store, func(*hub.Config)) (*hub.Hub, error)
	// breakGlass is the break-glass inventory (nil: none given).
	breakGlass *hub.Inventory
	current    *atomic.Pointer[term]
}

// checkDegradedFlags checks degraded mode's flags before the hub starts: the journal's directory
// exists, the break-glass inventory reads (with its credentials files).
func checkDegradedFlags(k *kubeOptions) (*hub.Inventory, error) {
	if k.breakGlass != "" && k.degradedJournal == "" {
		return nil, errors.New("--break-glass-inventory needs --degraded-journal: the break-glass BMCs are used only in degraded mode")
	}
	if k.degradedJournal == "" {
		return nil, nil
	}
	if st, err := os.Stat(filepath.Dir(k.degradedJournal)); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("--degraded-journal %s: its directory must exist (a volume that outlives the container: an emptyDir)", k.degradedJournal)
	}
	if k.breakGlass == "" {
		return nil, nil
	}
	inv, err := hub.LoadInventory(k.breakGlass)
	if err != nil {
		return nil, fmt.Errorf("--break-glass-inventory: %w", err)
	}
	return &inv, nil
}

// retry is how often the degraded hub asks the API server whether it answers again.
func (d *degraded) retry() time.Duration { return d.k.leaseDuration / 10 }

// authority bounds a leader's own lease by its clock (a standby takes it a lease duration after the
// last renewal at the earliest; half a retry period is left for clocks and round trips), and a
// degraded term after the API server last failed to answer.
func (d *degraded) authority() time.Duration { return d.k.leaseDuration - d.retry()/2 }

// apiAnswers reads the Lease within timeout: nil when the API server answers.
func (d *degraded) apiAnswers(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lease coordinationv1.Lease
	return d.c.Get(ctx, client.ObjectKey{Namespace: d.k.namespace, Name: d.k.lease}, &lease)
}

// afterLoss is kube.Elect's lost: the Lease was lost without being given up. With quorum lost as a
// majority of observers sees it, and the lease still this leader's by its clock, it runs a degraded
// term until the API server answers; otherwise it returns at once and the replica campaigns again.
func (d *degraded) afterLoss(ctx context.Context, leader *kube.Leader, renewed time.Time, last *hub.Hub) {
	if d.k.degradedJournal == "" || last == nil {
		return
	}
	now := time.Now()
	q, why := last.EtcdQuorum(now)
	if q != hub.QuorumLost {
		d.log.Warn("lost the lease without giving it up; not entering degraded mode", "lease", d.k.namespace+"/"+d.k.lease, "why", why)
		return
	}
	// client-go gives the lease up after the renew deadline plus a retry period without a renewal
	// (0.85 of the lease duration); half a retry period more for this probe leaves the decision
	// within the authority.
	if err := d.apiAnswers(ctx, d.retry()/2); err == nil {
		return // deposed, or the API server is back: campaign again
	}
	// Decided now, after the probe: by now no standby may have taken the Lease yet.
	now = time.Now()
	if held := now.Sub(renewed); renewed.IsZero() || held > d.authority() {
		d.log.Warn("quorum lost, but the lease was last renewed too long ago to act alone: another replica may hold it",
			"renewed", renewed, "ago", held.Round(time.Millisecond))
		return
	}
	inv := last.Inventory()
	t := degradedTerm{Identity: leader.Identity(), Epoch: leader.Epoch(), Since: now, Why: why, Unreachable: now, Witnesses: inv.Witnesses}
	for _, m := range inv.Machines {
		t.Machines = append(t.Machines, termMachine{Name: m.Name, Node: m.Node, Member: m.Member, Class: m.Class, Pool: m.Pool, Hold: m.Hold})
	}
	d.run(ctx, t, snapshotBrakes(last.Status(ctx)), degradedInventory(inv, d.breakGlass))
}

// resume continues the degraded term a hub of this pod left (t, from the term file) when the API
// server still does not answer and the term's authority lasts; it returns when it answers.
func (d *degraded) resume(ctx context.Context, t degradedTerm, base hub.Inventory) {
	if err := d.apiAnswers(ctx, d.retry()); err == nil {
		d.log.Info("a degraded term was left unfinished; the API server answers: its journal is imported once this replica leads",
			"identity", t.Identity, "epoch", t.Epoch)
		return
	}
	if ago := time.Since(t.Unreachable); ago > d.authority() {
		d.log.Warn("a degraded term was left unfinished and its authority has lapsed: waiting for the API server like any replica",
			"identity", t.Identity, "epoch", t.Epoch, "apiServerLastUnreachable", t.Unreachable, "ago", ago.Round(time.Second))
		return
	}
	d.log.Warn("continuing the degraded term a hub of this pod left", "identity", t.Identity, "epoch", t.Epoch, "since", t.Since)
	d.run(ctx, t, nil, degradedInventory(termInventory(base, t), d.breakGlass))
}

// run runs one degraded hub on inv with the local journal until the API server answers or ctx ends.
// brakes, for a new term, are the brakes in force when the API server was lost (with the machines
// whose remediation through the API server is in flight detached); a continued term has its own.
func (d *degraded) run(ctx context.Context, t degradedTerm, brakes *hub.Brakes, inv hub.Inventory) {
	k := d.k
	j, err := hub.OpenJournal(k.degradedJournal, d.o.keep)
	if err != nil {
		d.log.Error("degraded mode: opening the local journal", "err", err)
		return
	}
	defer j.Close()
	if brakes != nil {
		if err := j.SaveBrakes(ctx, *brakes); err != nil {
			d.log.Error("degraded mode: recording the brakes in the local journal", "err", err)
			return
		}
	}
	if err := writeTerm(k.degradedJournal, t); err != nil {
		d.log.Error("degraded mode", "err", err)
		return
	}
	var unreachable atomic.Int64
	unreachable.Store(t.Unreachable.UnixNano())
	with := "BMCs from the break-glass inventory " + k.breakGlass + "; power actions only (no owner hand-over, no metal3 annotation)"
	if d.breakGlass == nil {
		with = "no break-glass inventory (--break-glass-inventory): no BMC is within reach, every machine is held"
	}
	why := fmt.Sprintf("since %s the API server does not answer and %s; acting alone as %s at epoch %d, local journal %s; %s",
		t.Since.UTC().Format(time.RFC3339), t.Why, t.Identity, t.Epoch, k.degradedJournal, with)
	d.log.Warn("degraded mode: acting without the API server", "why", why)
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	var h *hub.Hub
	var quorumBack atomic.Pointer[string] // once a pass sees etcd's quorum again: nothing new starts
	h, err = d.newHub(j, func(cfg *hub.Config) {
		cfg.Inventory, cfg.Degraded, cfg.Brakes, cfg.Notify = inv, why, j, nil
		if d.breakGlass == nil {
			cfg.PowerFor = func(m hub.Machine) (hub.Power, error) {
				return nil, fmt.Errorf("%s: etcd has lost quorum and the API server does not answer; without a break-glass inventory (--break-glass-inventory) Hale cannot reach its BMC: held until the API server answers", m.Name)
			}
		}
		cfg.OwnerFor = func(m hub.Machine) (hub.Owner, error) {
			return nil, fmt.Errorf("%s: its owner controller is reached through the API server, which does not answer (degraded mode): held until it does", m.Name)
		}
		cfg.Standby = func() string {
			if ago := time.Since(time.Unix(0, unreachable.Load())); ago > d.authority() {
				return fmt.Sprintf("degraded mode: the API server last failed to answer %v ago, longer than this term's authority (%v): another replica may lead", ago.Round(time.Millisecond), d.authority())
			}
			if why := quorumBack.Load(); why != nil {
				return "degraded mode: etcd has quorum again (" + *why + "): nothing new starts until the API server answers this hub (a replica that reaches it leads after a lease duration)"
			}
			return ""
		}
		cfg.AfterPass = func(uint64) {
			if q, why := h.EtcdQuorum(time.Now()); q == hub.QuorumHeld && quorumBack.Load() == nil {
				quorumBack.Store(&why)
				d.log.Warn("degraded mode: etcd has quorum again; starting nothing new until the API server answers", "etcd", why)
			}
		}
	})
	if err != nil {
		d.log.Error("degraded mode: starting the hub", "err", err)
		return
	}
	defer d.current.Store(nil)
	done := make(chan error, 1)
	go func() { done <- h.Run(hctx) }()
	tick := time.NewTicker(d.retry())
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			d.log.Error("degraded mode: the hub stopped", "err", err)
			return
		case <-ctx.Done():
			stop()
			<-done
			return
		case <-tick.C:
		}
		if err := d.apiAnswers(ctx, d.retry()); err == nil {
			d.log.Info("the API server answers again: leaving degraded mode; the local journal is imported once this replica leads",
				"identity", t.Identity, "epoch", t.Epoch)
			stop()
			<-done
			return
		}
		t.Unreachable = time.Now()
		unreachable.Store(t.Unreachable.UnixNano())
		if err := writeTerm(k.degradedJournal, t); err != nil {
			d.log.Warn("degraded mode", "err", err)
		}
	}
}

// snapshotBrakes are the brakes in force in st, for the degraded term: every pause (the operator's
// and a Cluster API Cluster's) as one, the suspend, the detached machines, and the machines with a
// remediation in flight through the API server, detached until it answers.
func snapshotBrakes(st hub.Status) *hub.Brakes {
	b := &hub.Brakes{Suspended: st.SuspendedBy, Detached: map[string]hub.Brake{}}
	if len(st.PausedBy) > 0 {
		b.Paused = &hub.Brake{By: st.PausedBy[0].By, Reason: hub.DescribeBrakes(st.PausedBy), Since: st.PausedBy[0].Since}
	}
	for _, m := range st.Machines {
		switch {
		case m.DetachedBy != nil:
			b.Detached[m.Name] = *m.DetachedBy
		case m.Remediation != nil:
			b.Detached[m.Name] = hub.Brake{By: "hale", Since: st.Time, Reason: fmt.Sprintf("remediation %s (%s), begun through the API server, is in flight: held until the API server answers",
				m.Remediation.ID, m.Remediation.Strategy)}
		}
	}
	return b
}

// importDegraded writes what a degraded term recorded in the local journal into Remediation objects
// (j: this leader's), says each as an Event (notify), then removes the local journal and its term
// file. An import cut short is done again by the next leader of this pod: the objects are not written
// twice.
func importDegraded(ctx context.Context, k *kubeOptions, j *kube.Journal, notify func(hub.Notice), log *slog.Logger) error {
	t, err := readTerm(k.degradedJournal)
	if err != nil {
		return err
	}
	if _, err := os.Stat(k.degradedJournal); errors.Is(err, os.ErrNotExist) {
		if t != nil {
			return os.Remove(termPath(k.degradedJournal))
		}
		return nil
	}
	local, err := hub.OpenJournal(k.degradedJournal, 0)
	if err != nil {
		return err
	}
	rems, err := local.All(ctx)
	local.Close()
	if err != nil {
		return err
	}
	term := "a degraded term"
	if t != nil {
		term = fmt.Sprintf("the degraded term of %s at epoch %d (from %s, %s)", t.Identity, t.Epoch, t.Since.UTC().Format(time.RFC3339), t.Why)
	}
	var names []string
	for _, r := range rems {
		note := fmt.Sprintf("recorded in the local journal %s during %s, while the API server did not answer; imported at epoch %d", k.degradedJournal, term, j.Epoch())
		fresh, err := j.Import(ctx, r, note)
		if err != nil {
			return fmt.Errorf("importing remediation %s of %s from %s: %w", r.ID, r.Machine, k.degradedJournal, err)
		}
		names = append(names, fmt.Sprintf("%s %s", r.Machine, r.State))
		if !fresh || notify == nil {
			continue
		}
		reason, warn := hub.ReasonRemediated, false
		switch r.State {
		case hub.InProgress:
			reason = hub.ReasonRemediationInterrupted
		case hub.Failed, hub.Aborted:
			reason, warn = hub.ReasonRemediationFailed, true
		}
		last := ""
		if n := len(r.History); n > 0 {
			last = r.History[n-1].Detail
		}
		notify(hub.Notice{Machine: r.Machine, Reason: reason, Remediation: r.ID, Warning: warn,
			Message: fmt.Sprintf("while the API server did not answer (degraded mode), %s: %s: %s", strings.Join(quorum.Plan{Steps: r.Steps}.StepStrings(), " → "), r.State, last)})
	}
	msg := fmt.Sprintf("%s: %d remediations recorded (%s), imported into Remediation objects", term, len(rems), strings.Join(names, ", "))
	log.Warn("degraded term imported", "remediations", len(rems), "term", term)
	if notify != nil {
		notify(hub.Notice{Reason: hub.ReasonDegradedMode, Message: msg, Warning: true})
	}
	if err := os.Remove(k.degradedJournal); err != nil {
		return err
	}
	if t != nil {
		return os.Remove(termPath(k.degradedJournal))
	}
	return nil
}
