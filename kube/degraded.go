package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/degraded"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// Degraded mode's rules (when a leader may act alone, for how long, with what) are package
// hub/degraded's; Degraded runs its terms, and ImportDegraded brings a term's local journal into the
// Kubernetes objects once the API server answers.

// Degraded runs degraded terms for a hub replica that leads through a Lease (kube.Elect).
type Degraded struct {
	// Journal is the local journal's path (bbolt, on a volume that outlives the container), the term
	// file beside it; History the finished remediations kept per machine in it.
	Journal string
	History int
	// BreakGlass is the break-glass inventory (nil: none given), read from BreakGlassPath.
	BreakGlass     *pass.Inventory
	BreakGlassPath string
	// Namespace and Lease name the Lease the replicas lead through; LeaseDuration is its duration.
	Namespace, Lease string
	LeaseDuration    time.Duration
	Client           client.Client
	// NewHub starts a hub on a journal, with its configuration adjusted.
	NewHub func(journal.Store, func(*hub.Config)) (*hub.Hub, error)
	// Stopped is called when a term's hub has stopped.
	Stopped func()
	Log     *slog.Logger
}

func (d *Degraded) lease() degraded.Lease { return degraded.Lease{Duration: d.LeaseDuration} }

// apiAnswers reads the Lease within timeout: nil when the API server answers.
func (d *Degraded) apiAnswers(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lease coordinationv1.Lease
	return d.Client.Get(ctx, client.ObjectKey{Namespace: d.Namespace, Name: d.Lease}, &lease)
}

// AfterLoss is Elect's lost: the Lease was lost without being given up. With quorum lost as a
// majority of observers sees it, and the lease still this leader's by its clock, it runs a degraded
// term until the API server answers, once the lost term's pipeline has stopped (stopped closed);
// otherwise it returns at once and the replica campaigns again. It decides at once, on the latest view
// of the lost term's hub (last) from after the last renewal (a renewal is a write: etcd had quorum
// then), not once that hub has stopped: with the hub's timing the lease is lost less than two retry
// periods before this leader's authority ends (about 0.77 and 0.95 of the lease duration), and a hub
// that took longer to stop (a pass held by a write to the API server, on a busy node) found its
// authority lapsed and campaigned again, which cannot succeed without quorum: nobody acted (found on
// the real kubeadm cluster, two of three nodes frozen).
func (d *Degraded) AfterLoss(ctx context.Context, leader *Leader, renewed time.Time, last *hub.Hub, stopped <-chan struct{}) {
	if d.Journal == "" || last == nil {
		return
	}
	loss := degraded.Loss{Renewed: renewed}
	if loss.Quorum, loss.QuorumWhy = last.EtcdQuorum(renewed); loss.Quorum == pass.QuorumLost {
		// client-go gives the lease up after the renew deadline plus a retry period without a renewal
		// (0.77 of the lease duration with the hub's timing); half a retry period more for this probe
		// leaves the decision within the authority.
		loss.APIAnswers = d.apiAnswers(ctx, d.lease().Retry()/2) == nil
	}
	loss.Now = time.Now() // decided after the probe: by now no standby may have taken the Lease yet
	if ok, why := d.lease().Enter(loss); !ok {
		d.Log.Warn("lost the lease without giving it up; not entering degraded mode", "lease", d.Namespace+"/"+d.Lease, "why", why, "renewed", renewed)
		return
	}
	inv := last.Inventory()
	t := degraded.NewTerm(leader.Identity(), leader.Epoch(), loss.Now, loss.QuorumWhy, inv)
	select {
	case <-stopped: // nothing of the lost term runs beside the degraded term
	case <-ctx.Done():
		return
	}
	d.run(ctx, t, degraded.SnapshotBrakes(last.Status(ctx)), degraded.Inventory(inv, d.BreakGlass))
}

// Resume continues the degraded term a hub of this pod left (t, from the term file) when the API
// server still does not answer and the term's authority lasts; it returns when it answers.
func (d *Degraded) Resume(ctx context.Context, t degraded.Term, base pass.Inventory) {
	answers := d.apiAnswers(ctx, d.lease().Retry()) == nil
	if ok, why := d.lease().Continue(t, answers, time.Now()); !ok {
		d.Log.Warn(why, "identity", t.Identity, "epoch", t.Epoch, "apiServerLastUnreachable", t.Unreachable)
		return
	}
	d.Log.Warn("continuing the degraded term a hub of this pod left", "identity", t.Identity, "epoch", t.Epoch, "since", t.Since)
	d.run(ctx, t, nil, degraded.Inventory(degraded.TermInventory(base, t), d.BreakGlass))
}

// run runs one degraded hub on inv with the local journal until the API server answers or ctx ends.
// brakes, for a new term, are the brakes in force when the API server was lost (with the machines
// whose remediation through the API server is in flight detached); a continued term has its own.
func (d *Degraded) run(ctx context.Context, t degraded.Term, brakes *pass.Brakes, inv pass.Inventory) {
	j, err := boltfile.Open(d.Journal, d.History)
	if err != nil {
		d.Log.Error("degraded mode: opening the local journal", "err", err)
		return
	}
	defer j.Close()
	if brakes != nil {
		if err := j.SaveBrakes(ctx, *brakes); err != nil {
			d.Log.Error("degraded mode: recording the brakes in the local journal", "err", err)
			return
		}
	}
	if err := degraded.WriteTerm(d.Journal, t); err != nil {
		d.Log.Error("degraded mode", "err", err)
		return
	}
	var unreachable atomic.Int64
	unreachable.Store(t.Unreachable.UnixNano())
	with := "BMCs from the break-glass inventory " + d.BreakGlassPath + "; power actions only (no owner hand-over, no metal3 annotation)"
	if d.BreakGlass == nil {
		with = "no break-glass inventory (--break-glass-inventory): no BMC is within reach, every machine is held"
	}
	why := fmt.Sprintf("since %s the API server does not answer and %s; acting alone as %s at epoch %d, local journal %s; %s",
		t.Since.UTC().Format(time.RFC3339), t.Why, t.Identity, t.Epoch, d.Journal, with)
	d.Log.Warn("degraded mode: acting without the API server", "why", why)
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	var h *hub.Hub
	var quorumBack atomic.Pointer[string] // once a pass sees etcd's quorum again (EtcdQuorumSince): nothing new starts
	h, err = d.NewHub(j, func(cfg *hub.Config) {
		cfg.Inventory, cfg.Degraded, cfg.Brakes, cfg.Notify = inv, why, j, nil
		if d.BreakGlass == nil {
			cfg.PowerFor = func(m pass.Machine) (execute.Power, error) {
				return nil, fmt.Errorf("%s: etcd has lost quorum and the API server does not answer; without a break-glass inventory (--break-glass-inventory) Hale cannot reach its BMC: held until the API server answers", m.Name)
			}
		}
		cfg.OwnerFor = func(m pass.Machine) (execute.Owner, error) {
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
			if q, why := h.EtcdQuorumSince(time.Now(), t.Since); q == pass.QuorumHeld && quorumBack.Load() == nil {
				quorumBack.Store(&why)
				d.Log.Warn("degraded mode: etcd has quorum again; starting nothing new until the API server answers", "etcd", why)
			}
		}
	})
	if err != nil {
		d.Log.Error("degraded mode: starting the hub", "err", err)
		return
	}
	if d.Stopped != nil {
		defer d.Stopped()
	}
	done := make(chan error, 1)
	go func() { done <- h.Run(hctx) }()
	tick := time.NewTicker(d.lease().Retry())
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			d.Log.Error("degraded mode: the hub stopped", "err", err)
			return
		case <-ctx.Done():
			stop()
			<-done
			return
		case <-tick.C:
		}
		if err := d.apiAnswers(ctx, d.lease().Retry()); err == nil {
			d.Log.Info("the API server answers again: leaving degraded mode; the local journal is imported once this replica leads",
				"identity", t.Identity, "epoch", t.Epoch)
			stop()
			<-done
			return
		}
		t.Unreachable = time.Now()
		unreachable.Store(t.Unreachable.UnixNano())
		if err := degraded.WriteTerm(d.Journal, t); err != nil {
			d.Log.Warn("degraded mode", "err", err)
		}
	}
}

// ImportDegradedWhileLeading is ImportDegraded tried again every retry while ctx lasts (this replica
// leads), for up to patience: the degraded term's local journal is on this pod's disk only, and a
// standby that leads instead knows nothing of the term (an etcd recovery it carried out looks like a
// rebuild outside Hale, its fences unknown: no out-of-service taint). Right after an etcd recovery the
// API server comes and goes while etcd restarts under it, and a leader that gave the Lease up at the
// first failed write left the term to a standby (found on the real kubeadm cluster). It returns the
// notices to say and true, or false when ctx ended or patience ran out (the caller gives the Lease
// up; this pod's next term imports again).
func ImportDegradedWhileLeading(ctx context.Context, path string, j *Journal, brakeStore hub.BrakeStore, recoveries hub.RecoveryStore,
	retry, patience time.Duration, log *slog.Logger) ([]pass.Notice, bool) {
	deadline := time.Now().Add(patience)
	for attempt := 1; ; attempt++ {
		said, err := ImportDegraded(ctx, path, j, brakeStore, recoveries, log)
		if err == nil {
			return said, true
		}
		// Nothing is said: the next import returns every notice again.
		if !time.Now().Add(retry).Before(deadline) {
			log.Error("importing the degraded term's local journal: giving the Lease up; this pod's next term imports it",
				"journal", path, "attempts", attempt, "err", err)
			return nil, false
		}
		log.Warn("importing the degraded term's local journal: trying again while this replica leads (another replica would not know the term)",
			"journal", path, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(retry):
		}
	}
}

// ImportDegraded writes what a degraded term recorded in the local journal at path into Remediation
// objects (j: this leader's), writes an etcd recovery it carried out back (ImportRecovery: the record
// into the HealthPolicy's recoveries) and the brakes it recorded (degraded.ImportBrakes, into brakes;
// both stores nil without a HealthPolicy), then removes the local journal and
// its term file. It returns the notices to say once this leader's hub runs (Hub.Say: a log line, the
// timeline, a metric and an Event each), all of them once the whole import succeeded: an import
// cut short says nothing and is done again by the next leader of this pod, which writes no object
// twice and returns every notice again (the local journal is removed only at the end, so no notice
// is said twice).
func ImportDegraded(ctx context.Context, path string, j *Journal, brakeStore hub.BrakeStore, recoveries hub.RecoveryStore, log *slog.Logger) ([]pass.Notice, error) {
	t, err := degraded.ReadTerm(path)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if t != nil {
			return nil, os.Remove(degraded.TermPath(path))
		}
		return nil, nil
	}
	local, err := boltfile.Open(path, 0)
	if err != nil {
		return nil, err
	}
	rems, err := local.All(ctx)
	var rec *pass.RecoveryRecord
	var brakes pass.Brakes
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
	var said []pass.Notice
	for _, r := range rems {
		note := fmt.Sprintf("recorded in the local journal %s during %s, while the API server did not answer; imported at epoch %d", path, term, j.Epoch())
		if err := j.Import(ctx, r, note); err != nil {
			return nil, fmt.Errorf("importing remediation %s of %s from %s: %w", r.ID, r.Machine, path, err)
		}
		names = append(names, fmt.Sprintf("%s %s", r.Machine, r.State))
		reason, warn := pass.ReasonRemediated, false
		switch r.State {
		case journal.InProgress:
			reason = pass.ReasonRemediationInterrupted
		case journal.Failed, journal.Aborted:
			reason, warn = pass.ReasonRemediationFailed, true
		}
		last := ""
		if n := len(r.History); n > 0 {
			last = r.History[n-1].Detail
		}
		said = append(said, pass.Notice{Machine: r.Machine, Reason: reason, Remediation: r.ID, Warning: warn,
			Message: fmt.Sprintf("while the API server did not answer (degraded mode), %s: %s: %s", strings.Join(quorum.Plan{Steps: r.Steps}.StepStrings(), " → "), r.State, last)})
	}
	if rec != nil {
		if recoveries == nil {
			log.Warn("no HealthPolicy to keep the etcd recovery in: the members it retired are not held once imported", "token", rec.Plan.Token)
		}
		note := fmt.Sprintf("fenced by etcd recovery %s, recorded in the local journal %s during %s; imported at epoch %d", rec.Plan.Token, path, term, j.Epoch())
		notices, err := ImportRecovery(ctx, j, recoveries, *rec, note)
		if err != nil {
			return nil, fmt.Errorf("importing etcd recovery %s from %s: %w", rec.Plan.Token, path, err)
		}
		said = append(said, notices...)
		log.Warn("etcd recovery imported", "token", rec.Plan.Token)
	}
	msg := fmt.Sprintf("%s: %d remediations recorded (%s), imported into Remediation objects", term, len(rems), strings.Join(names, ", "))
	if brakeStore != nil {
		carried, err := degraded.ImportBrakes(ctx, brakeStore, brakes)
		if err != nil {
			return nil, fmt.Errorf("carrying the brakes of %s back into the HealthPolicy: %w", path, err)
		}
		if len(carried) > 0 {
			msg += "; its brakes carried back into the HealthPolicy: " + strings.Join(carried, ", ")
		}
	}
	said = append(said, pass.Notice{Reason: pass.ReasonDegradedMode, Message: msg, Warning: true})
	if err := os.Remove(path); err != nil {
		return nil, err
	}
	// The local journal is gone: its notices are said now, whatever becomes of the term file (an
	// import that finds a term file and no journal removes it).
	if t != nil {
		if err := os.Remove(degraded.TermPath(path)); err != nil {
			log.Warn("removing the degraded term's file: the next import removes it", "err", err)
		}
	}
	return said, nil
}
