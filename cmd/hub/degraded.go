package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/degraded"
	"github.com/hale-dev/hale/kube"
	"github.com/hale-dev/hale/quorum"
)

// Degraded mode's rules (when a leader may act alone, for how long, with what) are package
// hub/degraded's; this file runs its terms.

// degradedRunner runs degraded terms for runLeading.
type degradedRunner struct {
	o      runOptions
	k      *kubeOptions
	log    *slog.Logger
	c      client.Client
	newHub func(hub.Store, func(*hub.Config)) (*hub.Hub, error)
	// breakGlass is the break-glass inventory (nil: none given).
	breakGlass *hub.Inventory
	current    *atomic.Pointer[term]
}

func (d *degradedRunner) lease() degraded.Lease { return degraded.Lease{Duration: d.k.leaseDuration} }

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

// apiAnswers reads the Lease within timeout: nil when the API server answers.
func (d *degradedRunner) apiAnswers(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lease coordinationv1.Lease
	return d.c.Get(ctx, client.ObjectKey{Namespace: d.k.namespace, Name: d.k.lease}, &lease)
}

// afterLoss is kube.Elect's lost: the Lease was lost without being given up. With quorum lost as a
// majority of observers sees it, and the lease still this leader's by its clock, it runs a degraded
// term until the API server answers; otherwise it returns at once and the replica campaigns again.
func (d *degradedRunner) afterLoss(ctx context.Context, leader *kube.Leader, renewed time.Time, last *hub.Hub) {
	if d.k.degradedJournal == "" || last == nil {
		return
	}
	loss := degraded.Loss{Renewed: renewed}
	if loss.Quorum, loss.QuorumWhy = last.EtcdQuorum(time.Now()); loss.Quorum == hub.QuorumLost {
		// client-go gives the lease up after the renew deadline plus a retry period without a renewal
		// (0.85 of the lease duration); half a retry period more for this probe leaves the decision
		// within the authority.
		loss.APIAnswers = d.apiAnswers(ctx, d.lease().Retry()/2) == nil
	}
	loss.Now = time.Now() // decided after the probe: by now no standby may have taken the Lease yet
	if ok, why := d.lease().Enter(loss); !ok {
		d.log.Warn("lost the lease without giving it up; not entering degraded mode", "lease", d.k.namespace+"/"+d.k.lease, "why", why, "renewed", renewed)
		return
	}
	inv := last.Inventory()
	t := degraded.NewTerm(leader.Identity(), leader.Epoch(), loss.Now, loss.QuorumWhy, inv)
	d.run(ctx, t, degraded.SnapshotBrakes(last.Status(ctx)), degraded.Inventory(inv, d.breakGlass))
}

// resume continues the degraded term a hub of this pod left (t, from the term file) when the API
// server still does not answer and the term's authority lasts; it returns when it answers.
func (d *degradedRunner) resume(ctx context.Context, t degraded.Term, base hub.Inventory) {
	answers := d.apiAnswers(ctx, d.lease().Retry()) == nil
	if ok, why := d.lease().Continue(t, answers, time.Now()); !ok {
		d.log.Warn(why, "identity", t.Identity, "epoch", t.Epoch, "apiServerLastUnreachable", t.Unreachable)
		return
	}
	d.log.Warn("continuing the degraded term a hub of this pod left", "identity", t.Identity, "epoch", t.Epoch, "since", t.Since)
	d.run(ctx, t, nil, degraded.Inventory(degraded.TermInventory(base, t), d.breakGlass))
}

// run runs one degraded hub on inv with the local journal until the API server answers or ctx ends.
// brakes, for a new term, are the brakes in force when the API server was lost (with the machines
// whose remediation through the API server is in flight detached); a continued term has its own.
func (d *degradedRunner) run(ctx context.Context, t degraded.Term, brakes *hub.Brakes, inv hub.Inventory) {
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
	if err := degraded.WriteTerm(k.degradedJournal, t); err != nil {
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
	var quorumBack atomic.Pointer[string] // once a pass sees etcd's quorum again (EtcdQuorumSince): nothing new starts
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
			back := quorumBack.Load()
			if back == nil {
				back = new(string)
			}
			return d.lease().Standby(time.Unix(0, unreachable.Load()), time.Now(), *back)
		}
		cfg.AfterPass = func(uint64) {
			// Only on evidence from after the loss: this hub starts holding reports from before it.
			if q, why := h.EtcdQuorumSince(time.Now(), t.Since); q == hub.QuorumHeld && quorumBack.Load() == nil {
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
	tick := time.NewTicker(d.lease().Retry())
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
		if err := d.apiAnswers(ctx, d.lease().Retry()); err == nil {
			d.log.Info("the API server answers again: leaving degraded mode; the local journal is imported once this replica leads",
				"identity", t.Identity, "epoch", t.Epoch)
			stop()
			<-done
			return
		}
		t.Unreachable = time.Now()
		unreachable.Store(t.Unreachable.UnixNano())
		if err := degraded.WriteTerm(k.degradedJournal, t); err != nil {
			d.log.Warn("degraded mode", "err", err)
		}
	}
}

// policyStores are what the HealthPolicy keeps for the hub: the operator's brakes and the last etcd
// recovery (both nil without a policy).
type policyStores struct {
	brakes     hub.BrakeStore
	recoveries hub.RecoveryStore
}

// importDegraded writes what a degraded term recorded in the local journal into Remediation objects
// (j: this leader's), writes an etcd recovery it carried out back (kube.ImportRecovery: the record
// into the HealthPolicy) and the brakes it recorded (importBrakes), then removes the local journal and
// its term file. It returns the notices to say once this leader's hub runs (Hub.Say: a log line, the
// timeline, a metric and an Event each). An import cut short is done again by the next leader of this
// pod: the objects are not written twice.
func importDegraded(ctx context.Context, k *kubeOptions, j *kube.Journal, policy policyStores, log *slog.Logger) ([]hub.Notice, error) {
	recoveries := policy.recoveries
	t, err := degraded.ReadTerm(k.degradedJournal)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(k.degradedJournal); errors.Is(err, os.ErrNotExist) {
		if t != nil {
			return nil, os.Remove(degraded.TermPath(k.degradedJournal))
		}
		return nil, nil
	}
	local, err := hub.OpenJournal(k.degradedJournal, 0)
	if err != nil {
		return nil, err
	}
	rems, err := local.All(ctx)
	var rec *hub.RecoveryRecord
	var brakes hub.Brakes
	if err == nil {
		rec, err = local.Recovery(ctx)
	}
	if err == nil {
		brakes, err = local.LoadBrakes(ctx)
	}
	local.Close()
	if err != nil {
		return nil, err
	}
	term := "a degraded term"
	if t != nil {
		term = fmt.Sprintf("the degraded term of %s at epoch %d (from %s, %s)", t.Identity, t.Epoch, t.Since.UTC().Format(time.RFC3339), t.Why)
	}
	var names []string
	var said []hub.Notice
	for _, r := range rems {
		note := fmt.Sprintf("recorded in the local journal %s during %s, while the API server did not answer; imported at epoch %d", k.degradedJournal, term, j.Epoch())
		fresh, err := j.Import(ctx, r, note)
		if err != nil {
			return said, fmt.Errorf("importing remediation %s of %s from %s: %w", r.ID, r.Machine, k.degradedJournal, err)
		}
		names = append(names, fmt.Sprintf("%s %s", r.Machine, r.State))
		if !fresh {
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
		said = append(said, hub.Notice{Machine: r.Machine, Reason: reason, Remediation: r.ID, Warning: warn,
			Message: fmt.Sprintf("while the API server did not answer (degraded mode), %s: %s: %s", strings.Join(quorum.Plan{Steps: r.Steps}.StepStrings(), " → "), r.State, last)})
	}
	if rec != nil {
		if recoveries == nil {
			log.Warn("no HealthPolicy to keep the etcd recovery in: the members it retired are not held once imported", "token", rec.Plan.Token)
		}
		note := fmt.Sprintf("fenced by etcd recovery %s, recorded in the local journal %s during %s; imported at epoch %d", rec.Plan.Token, k.degradedJournal, term, j.Epoch())
		notices, err := kube.ImportRecovery(ctx, j, recoveries, *rec, note)
		said = append(said, notices...)
		if err != nil {
			return said, fmt.Errorf("importing etcd recovery %s from %s: %w", rec.Plan.Token, k.degradedJournal, err)
		}
		log.Warn("etcd recovery imported", "token", rec.Plan.Token)
	}
	msg := fmt.Sprintf("%s: %d remediations recorded (%s), imported into Remediation objects", term, len(rems), strings.Join(names, ", "))
	if policy.brakes != nil {
		carried, err := importBrakes(ctx, policy.brakes, brakes)
		if err != nil {
			return said, fmt.Errorf("carrying the brakes of %s back into the HealthPolicy: %w", k.degradedJournal, err)
		}
		if len(carried) > 0 {
			msg += "; its brakes carried back into the HealthPolicy: " + strings.Join(carried, ", ")
		}
	}
	said = append(said, hub.Notice{Reason: hub.ReasonDegradedMode, Message: msg, Warning: true})
	if err := os.Remove(k.degradedJournal); err != nil {
		return said, err
	}
	if t != nil {
		return said, os.Remove(degraded.TermPath(k.degradedJournal))
	}
	return said, nil
}

// importBrakes carries the brakes a degraded term recorded back into the HealthPolicy (store): each
// one the policy lacks is added, who set it and why kept; none is lifted. The pause `hub recover
// --yes` set holds until `hub resume`, as in standalone mode. It returns what it added.
func importBrakes(ctx context.Context, store hub.BrakeStore, term hub.Brakes) ([]string, error) {
	b, err := store.LoadBrakes(ctx)
	if err != nil {
		return nil, err
	}
	var added []string
	for _, f := range []struct {
		what       string
		from, into **hub.Brake
	}{{"paused", &term.Paused, &b.Paused}, {"suspended", &term.Suspended, &b.Suspended}} {
		if *f.from != nil && *f.into == nil {
			*f.into = *f.from
			added = append(added, fmt.Sprintf("%s by %s", f.what, **f.from))
		}
	}
	for _, m := range slices.Sorted(maps.Keys(term.Detached)) {
		if _, ok := b.Detached[m]; !ok {
			if b.Detached == nil {
				b.Detached = map[string]hub.Brake{}
			}
			b.Detached[m] = term.Detached[m]
			added = append(added, fmt.Sprintf("%s detached by %s", m, term.Detached[m]))
		}
	}
	if len(added) == 0 {
		return nil, nil
	}
	return added, store.SaveBrakes(ctx, b)
}
