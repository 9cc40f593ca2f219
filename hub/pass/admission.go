package pass

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/quorum"
)

// Admission: whether a machine may be acted on now, and if not why, for the hub's own pass and for an
// operator (`hub reboot`, a Remediation made with kubectl, Cluster API's remediate-machine annotation)
// alike. Every reason a machine is held for is listed once, in RuleOf, with whom it holds and whether
// an operator's --force overrides it; MachineHolds finds the holds for either. The quorum check itself
// (the planner's waiting) and the rate limit come after, on what the planner admits.

// Asker is who asks to act on a machine.
type Asker int

const (
	byHub      Asker = iota // the pass
	ByOperator              // an operator's reboot
)

// HoldRule says whom a hold's reason holds, and whether an operator's --force overrides it.
type HoldRule struct{ hub, operator, Forceable bool }

// RuleOf is the one list of the reasons a machine is held for, and their rules.
func RuleOf(r Reason) HoldRule {
	switch r {
	// The brakes, the inventory's hold and a BMC account in its wait: nobody acts, and no force
	// overrides them (they are lifted instead: attach, resume, unsuspend, the owner, the wait's end).
	case ReasonHeldByOwner, ReasonDetached, ReasonPaused, ReasonSuspended, ReasonBMCLoginBackoff:
		return HoldRule{hub: true, operator: true}
	// An operator's own (AdmitOperator): a hub that acts on nothing, a remediation under way, a
	// power-on that would run the old cluster's quorum beside the new one (two etcds serving), a
	// forced replace (it removes a member for good).
	case ReasonStandby, ReasonInFlight, ReasonOldQuorum, ReasonReplaceForced:
		return HoldRule{operator: true}
	// Quorum and the data: an operator may act against them, knowingly (--force, journaled). A
	// retired machine (an etcd recovery left it out of the new membership) is powered on with
	// --force: that costs the new cluster nothing, and is how it is brought back; the one harm it
	// can do, the old cluster's quorum running again, is OldQuorum, which no force overrides.
	case ReasonRetired, ReasonSurvivor, ReasonSilentVotersFirst, ReasonMemberAnswers, ReasonWaiting:
		return HoldRule{hub: true, operator: true, Forceable: true}
	// The hub's restraint with its own remediations (its history with the machine, a cause the
	// machines share, its rate): an operator's reboot is the way past them.
	// Planned work under way on the machine (a cordon, a rollout, a NodeMaintenance): the hub keeps its
	// hands off; an operator doing that work may reboot it.
	// Another health checker that judges the machine: the hub waits for its requests, which come as an
	// operator's.
	// The stall tolerance and the component grace (a machine that may come back by itself): an
	// operator who reboots it has judged that it will not.
	case ReasonCommonCause, ReasonRemediationNotBegun, ReasonCoolingDown, ReasonUnseen, ReasonFenced, ReasonGaveUp, ReasonFlapping, ReasonRateLimited,
		ReasonPlannedWork, ReasonExternallyChecked, ReasonMayResume, ReasonRestartFirst:
		return HoldRule{hub: true}
	}
	return HoldRule{hub: true, operator: true} // a reason not listed holds everyone, unforced
}

// holds reports whether the rule holds who.
func (r HoldRule) holds(who Asker) bool {
	if who == ByOperator {
		return r.operator
	}
	return r.hub
}

// Admission is what MachineHolds reads beyond the pass's facts: whether etcd's quorum is lost in the
// membership planned with, the voters that do not answer then (SilentVoters), and the machines held
// for a cause they share (commonCauses).
type Admission struct {
	Lost   bool
	Silent []string
	common map[string]Hold
}

// MachineHolds are the holds on m for who, in the order they are said (the first is the one the pass
// gives); none: it may be acted on, as far as the quorum check and the rate limit allow. The pass
// holds only a machine it would act on (Unhealthy; a retired one whatever its verdict but Healthy);
// an operator is held whatever the verdict. For the pass, the last remediation's history is
// consulted only when nothing else holds it, and its count of failures comes with it.
func MachineHolds(f *Facts, m *Machine, a *assess.Assessment, ad Admission, who Asker) []Hold {
	if who == byHub && a.Verdict == assess.VerdictHealthy {
		return nil // every hold below is of a machine the hub does not see Healthy
	}
	var out []Hold
	add := func(h Hold, ok bool) bool {
		if ok && RuleOf(h.Reason).holds(who) {
			out = append(out, h)
		}
		return who == byHub && len(out) > 0 // the pass says one
	}
	unhealthy := who == ByOperator || a.Verdict == assess.VerdictUnhealthy
	if h, ok := f.Retired.Hold(m.Name, f.Observations, f.Inventory.Policy.Assess.StaleAfter); add(h, ok && (who == ByOperator || a.Verdict != assess.VerdictHealthy)) {
		return out
	}
	if h, ok := f.Retired.survivorHold(m.Name); add(h, ok && unhealthy) {
		return out
	}
	if h, ok := answersHold(*f, *m, *a, ad.Lost, ad.Silent); add(h, ok && unhealthy) {
		return out
	}
	if h, ok := ad.common[m.Name]; add(h, ok && unhealthy) {
		return out
	}
	if !unhealthy {
		return out
	}
	detached, isDetached := f.Detached[m.Name]
	sf := f.beginFailed[m.Name]
	work := PlannedWorkOn(*f, *m)
	for _, h := range []struct {
		Hold
		ok bool
	}{
		{Hold{Reason: ReasonHeldByOwner, Why: m.Hold}, m.Hold != ""},
		{Hold{Reason: ReasonPlannedWork, Why: work}, work != ""},
		{Hold{Reason: ReasonExternallyChecked, Why: m.CheckedBy}, m.CheckedBy != ""},
		{Hold{Reason: ReasonDetached, Why: fmt.Sprintf("detached by %s: no action until `hub attach %s`", detached, m.Name)}, isDetached},
		{Hold{Reason: ReasonRemediationNotBegun, Why: fmt.Sprintf("could not begin its remediation: %s (trying again at %s)", sf.why,
			sf.at.Add(sf.Wait()).Format(time.TimeOnly))}, !sf.at.IsZero() && f.Now.Sub(sf.at) < sf.Wait()},
		{Hold{Reason: ReasonBMCLoginBackoff, Why: f.LoginWait[m.Name]}, f.LoginWait[m.Name] != ""},
		{Hold{Reason: ReasonPaused, Why: fmt.Sprintf("the hub is paused (%s): nothing starts until the pause is lifted", f.Paused)}, who == ByOperator && f.Paused != ""},
		{Hold{Reason: ReasonSuspended, Why: "the hub is suspended (observe-only): use --dry-run to see the plan, or `hub unsuspend`"}, who == ByOperator && f.Suspended},
	} {
		if add(h.Hold, h.ok) {
			return out
		}
	}
	if who == byHub {
		h := historyHold(*f, *m, *a)
		if st := stallOf(*f, *m, *a, ad.Lost); h.Why == "" && st.hold.Why != "" {
			h.Reason, h.Why = st.hold.Reason, st.hold.Why
		}
		if h.Why != "" || h.failed > 0 {
			out = append(out, h) // the count of failures rides with it, held or not
		}
	}
	return out
}

// Unforceable is the first of an operator's holds that --force does not override (ok false: none).
func Unforceable(holds []Hold) (Hold, bool) {
	i := slices.IndexFunc(holds, func(h Hold) bool { return !RuleOf(h.Reason).Forceable })
	if i < 0 {
		return Hold{}, false
	}
	return holds[i], true
}

// WorkKubeadmUpgrade is the kind of planned work a kubeadm upgrade is (policy.plannedWork).
const WorkKubeadmUpgrade = "kubeadmUpgrade"

// kubeadmUpgradeFor bounds how long an upgrade holds its machine: kubeadm removes its directory when
// done; one an upgrade that failed left behind holds no longer than this.
const kubeadmUpgradeFor = time.Hour

// kubeadmUpgradeSilent bounds how long an upgrade holds its machine once the agent that reported it is
// silent: kubeadm waits at most 5 min (its default timeouts.upgradeManifests) for each static pod it
// replaces, and replaces none on a machine that has died; an upgrade restarts static pods, never the
// agent (a DaemonSet's pod), so a silent agent is a machine in trouble, not planned work. Without this
// bound a machine that died during an upgrade waited kubeadmUpgradeFor.
const kubeadmUpgradeSilent = 5 * time.Minute

// PlannedWorkOn says what planned work is under way on m ("" when none): what the inventory says
// (Machine.PlannedWork: Kubernetes mode's discovery), else a kubeadm upgrade its agent reports.
func PlannedWorkOn(f Facts, m Machine) string {
	return cmp.Or(m.PlannedWork, kubeadmUpgrade(f, m))
}

// plannedWork is PlannedWorkOn of every machine that has some (nil when none). Only the few whose
// agents report an upgrade (Assessment.UpgradeAt) have their reports looked up.
func plannedWork(f Facts) map[string]string {
	var out map[string]string
	for i := range f.Inventory.Machines {
		m := &f.Inventory.Machines[i]
		w := m.PlannedWork
		if a := assessmentAt(f.Assessments, i, m.Name); w == "" && a != nil && !a.UpgradeAt.IsZero() {
			w = kubeadmUpgrade(f, *m)
		}
		if w != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[m.Name] = w
		}
	}
	return out
}

// kubeadmUpgrade says what kubeadm upgrade is under way on m, as its agent's latest report says
// (health.Report.KubeadmUpgrade), when policy.plannedWork has it; "" when none.
func kubeadmUpgrade(f Facts, m Machine) string {
	r, ok := f.Observations.Reports[m.Node]
	if !ok || r.KubeadmUpgrade.IsZero() || f.Now.Sub(r.KubeadmUpgrade) >= kubeadmUpgradeFor || f.Now.Sub(r.SentAt) >= kubeadmUpgradeSilent ||
		!slices.Contains(f.Inventory.Policy.PlannedWork, WorkKubeadmUpgrade) {
		return ""
	}
	silent := ""
	if f.Now.Sub(r.SentAt) > f.Inventory.Policy.Assess.StaleAfter {
		silent = fmt.Sprintf(", though its agent has been silent since %s: held until %s at most", r.SentAt.UTC().Format(time.RFC3339),
			r.SentAt.Add(kubeadmUpgradeSilent).UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("a kubeadm upgrade is replacing %s's static pod manifests (since %s, as its agent reports): planned work; "+
		"Hale waits until it is done (policy.plannedWork: %s)%s", m.Node, r.KubeadmUpgrade.UTC().Format(time.RFC3339), WorkKubeadmUpgrade, silent)
}

// The reasons only an operator's request is refused for: the pass never meets them (it runs only
// where the hub acts, it skips a machine in flight, and it never powers on a retired machine).
const (
	// ReasonStandby: this hub acts on nothing now (not leading, or not running yet); a dry run still
	// shows the plan.
	ReasonStandby Reason = "Standby"
	// ReasonInFlight: a remediation of the machine is under way.
	ReasonInFlight Reason = "InFlight"
	// ReasonOldQuorum: a retired machine whose power-on would run a quorum of the old etcd cluster,
	// which would serve its old data beside the new one.
	ReasonOldQuorum Reason = "OldQuorum"
	// ReasonReplaceForced: a replace asked with --force: a replace is never forced over the quorum
	// check (it removes a member for good).
	ReasonReplaceForced Reason = "ReplaceForced"
)

// ErrRefused: an operator's request was refused (the hub's ErrRefused).
var ErrRefused = errors.New("refused")

// OperatorRequest is an operator's request to act on a machine: `hub reboot`, and what comes as one
// (a HaleRemediation, a Remediation made with kubectl, Cluster API's remediate-machine annotation).
type OperatorRequest struct {
	Strategy      quorum.Strategy
	Force, DryRun bool
}

// Beside is what the hub found, beside the pass's facts, for an operator's request on a machine.
type Beside struct {
	// Standby says why this hub acts on nothing now ("": it acts).
	Standby string
	// InFlight is the remediation under way on the machine ("": none).
	InFlight string
	// Live is the etcd membership now, for the quorum check; LiveErr why it is not known.
	Live    quorum.Cluster
	LiveErr error
	// Work is the remediations under way, which the machine's plan goes beside.
	Work []quorum.Machine
	// OldQuorum says why powering the machine on would run the old cluster's quorum ("": it would not).
	OldQuorum string
}

// dryRunSeesPast says whether a dry run shows the plan past a hold no force overrides: past the brakes,
// a standby hub and the machine's own holds (what would be done once they are lifted), not past what
// no lifting changes (a remediation under way, the old quorum, a forced replace).
func dryRunSeesPast(r Reason) bool {
	return r != ReasonInFlight && r != ReasonOldQuorum && r != ReasonReplaceForced
}

// Admitted is an operator's request as admitted: its plan, and what a --force overrode ("": nothing).
type Admitted struct {
	Plan      quorum.Plan
	Overrides string
}

// AdmitOperator is the one admission of an operator's request on m: the holds RuleOf lists for an
// operator (MachineHolds, and the operator's own: standby, in flight, the old quorum, a forced
// replace), then the quorum check (the plan beside the work under way). A hold no force overrides
// refuses it (a dry run still shows the plan past some: dryRunSeesPast); the quorum check's
// refusal and the forceable holds refuse it unless req.Force, which the Admitted then says it
// overrode. Every refusal wraps ErrRefused and names the machine.
func AdmitOperator(f Facts, m Machine, req OperatorRequest, b Beside) (Admitted, error) {
	member := m.Member != "" && b.LiveErr == nil
	ad := Admission{}
	if member {
		ad.Lost, ad.Silent = b.Live.Budget(f.Inventory.Policy.Quorum).QuorumLost(), SilentVoters(f, b.Live)
	}
	holds := []Hold{}
	for _, h := range []struct {
		Hold
		ok bool
	}{
		{Hold{Reason: ReasonStandby, Why: b.Standby}, b.Standby != ""},
		{Hold{Reason: ReasonInFlight, Why: fmt.Sprintf("%s already has remediation %s in flight (`hub explain %s`)", m.Name, b.InFlight, m.Name)}, b.InFlight != ""},
		{Hold{Reason: ReasonReplaceForced, Why: "a replace is never forced over the quorum check"}, req.Strategy == quorum.Replace && req.Force},
		{Hold{Reason: ReasonOldQuorum, Why: b.OldQuorum}, b.OldQuorum != ""},
	} {
		if h.ok {
			holds = append(holds, h.Hold)
		}
	}
	a := AssessmentOf(f.Assessments, -1, m.Name)
	holds = append(holds, MachineHolds(&f, &m, &a, ad, ByOperator)...)
	if hd, ok := Unforceable(holds); ok && (!req.DryRun || !dryRunSeesPast(hd.Reason)) {
		return Admitted{}, fmt.Errorf("%w: %s: %s", ErrRefused, m.Name, hd.Why)
	}
	var refusal []string
	for _, hd := range holds {
		if RuleOf(hd.Reason).Forceable {
			refusal = append(refusal, hd.Why)
		}
	}
	plan := MachinePlan(req.Strategy, m)
	if m.Member != "" {
		err := fmt.Errorf("cannot check quorum: %w", b.LiveErr)
		if b.LiveErr == nil {
			opts := m.Replace
			opts.NewMember = m.Member + NewMemberSuffix
			plan, err = b.Live.PlanBeside(f.Inventory.Policy.Quorum, quorum.Machine{Name: m.Name, Member: m.Member, Strategy: req.Strategy, Replace: opts}, b.Work)
		}
		if err != nil {
			plan, refusal = quorum.Plan{Strategy: quorum.Reboot, Member: m.Member,
				Steps: []quorum.Step{{Op: quorum.OpPowerCycle, Member: m.Member}, {Op: quorum.OpAwaitHealthy, Member: m.Member}}}, append(refusal, err.Error())
		}
	}
	if len(refusal) == 0 {
		return Admitted{Plan: plan}, nil
	}
	why := strings.Join(refusal, "; and ")
	if !req.Force {
		return Admitted{Plan: plan}, fmt.Errorf("%w: %s of %s: %s (--force overrides this for a reboot, knowingly: it is journaled as forced)", ErrRefused, req.Strategy, m.Name, why)
	}
	return Admitted{Plan: plan, Overrides: why}, nil
}
