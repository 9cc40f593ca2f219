package pass

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/assess/assesstest"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// Every reason a machine is held for, through both paths: the pass (decide) holds the machine with
// it, and an operator's reboot (machineHolds for byOperator, then the quorum check) is refused by it
// exactly when ruleOf says it holds an operator, and goes through with --force exactly when it says
// a force overrides it.
func TestOneAdmissionRule(t *testing.T) {
	quorumLost := func() *scene { return newScene().witnesses("w-0", "w-1").dead(1).dead(2) }
	for _, tc := range []struct {
		reason  Reason
		machine string
		scene   func() *scene
	}{
		{ReasonHeldByOwner, "m2", func() *scene {
			s := newScene().dead(2)
			s.f.Inventory.Machines[2].Hold = "BareMetalHost detached"
			return s
		}},
		{ReasonPlannedWork, "m2", func() *scene {
			s := newScene().dead(2)
			s.f.Inventory.Machines[2].PlannedWork = "its Node is cordoned"
			return s
		}},
		{ReasonExternallyChecked, "m2", func() *scene {
			s := newScene().dead(2)
			s.f.Inventory.Machines[2].CheckedBy = "MachineHealthCheck prod/cp judges it and hands its remediations to Hale"
			return s
		}},
		{ReasonDetached, "m2", func() *scene { s := newScene().dead(2); s.f.Detached["m2"] = Brake{By: "alice"}; return s }},
		{ReasonPaused, "m2", func() *scene { s := newScene().dead(2); s.f.Paused = "operator alice"; return s }},
		{ReasonSuspended, "m2", func() *scene { s := newScene().dead(2); s.f.Suspended = true; return s }},
		{ReasonBMCLoginBackoff, "m2", func() *scene {
			s := newScene().dead(2)
			s.f.LoginWait = map[string]string{"m2": "its BMC refused the credentials: no login until 04:05:00"}
			return s
		}},
		{ReasonRemediationNotBegun, "m2", func() *scene {
			s := newScene().dead(2)
			s.f.beginFailed["m2"] = BeginFailure{why: "ipmitool missing", at: s.f.Now.Add(-10 * time.Second), InARow: 4}
			return s
		}},
		{ReasonCoolingDown, "m2", func() *scene { return newScene().dead(2).remediated(2, "reboot", journal.Succeeded, time.Minute, 1) }},
		{ReasonFenced, "m2", func() *scene { return newScene().dead(2).remediated(2, "fence", journal.Succeeded, time.Hour, 1) }},
		{ReasonGaveUp, "m2", func() *scene { return newScene().dead(2).remediated(2, "reboot", journal.Failed, 10*time.Minute, 3) }},
		{ReasonFlapping, "m2", func() *scene { return newScene().dead(2).remediated(2, "reboot", journal.Succeeded, 10*time.Minute, 3) }},
		{ReasonUnseen, "m2", func() *scene {
			return newScene().dead(2).remediated(2, "reboot", journal.Failed, 10*time.Minute, 1).cycled(2, 20*time.Minute, 30*time.Minute)
		}},
		{ReasonRateLimited, "m2", func() *scene {
			s := quorumLost()
			s.f.Inventory.Policy.RateMax, s.f.RecentStarts = 3, 2
			return s
		}},
		{ReasonCommonCause, "m0", func() *scene {
			s := newScene()
			for i, m := range assesstest.Machines() {
				s.f.Assessments[i] = assess.Assessment{Machine: m.Name, Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Healthy, EtcdAnswers: true,
					Failing: []string{"apiserver"}, Reasons: []string{"apiserver failing for 15s"}, Since: s.f.Now.Add(-15 * time.Second)}
			}
			return s
		}},
		{ReasonSilentVotersFirst, "m0", func() *scene {
			s := quorumLost()
			s.f.Assessments[0] = assess.Assessment{Machine: "m0", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy, EtcdAnswers: true,
				Reasons: []string{"etcd failing for 10s: etcdserver: no leader"}}
			return s
		}},
		{ReasonMemberAnswers, "m0", func() *scene {
			s := newScene().witnesses("w-0", "w-1")
			for i, m := range assesstest.Machines() {
				s.f.Assessments[i] = assess.Assessment{Machine: m.Name, Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy, OwnAnswers: true,
					Reasons: []string{"etcd failing for 10s: etcdserver: no leader"}, Since: s.f.Now.Add(-time.Minute)}
			}
			return s
		}},
		{ReasonSurvivor, "m0", func() *scene {
			s := newScene().witnesses("w-0", "w-1")
			s.f.Assessments[0] = assess.Assessment{Machine: "m0", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy,
				Reasons: []string{"etcd member etcd-0 unreachable"}, Since: s.f.Now.Add(-5 * time.Second)}
			s.f.Retired = Retirement{Token: "hale-c0-1", Cluster: "c0", survivor: Retiree{Machine: "m0", Member: "etcd-0"}}
			return s
		}},
		{ReasonRetired, "m2", func() *scene {
			s := newScene().dead(2)
			s.f.Retired = Retirement{Token: "hale-c0-1", Cluster: "c0", Quorum: 2, Members: []Retiree{{Machine: "m2", Member: "etcd-2"}}}
			return s
		}},
		{ReasonWaiting, "m0", func() *scene { // m2 dead; m0's member healthy, its kubelet failing: its reboot would cost quorum
			s := newScene().dead(2)
			s.f.Assessments[0] = assess.Assessment{Machine: "m0", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Healthy, EtcdAnswers: true,
				Reasons: []string{"kubelet failing for 4m"}, Since: s.f.Now.Add(-4 * time.Minute)}
			return s
		}},
		{ReasonMayResume, "m2", func() *scene { // dead 5 s ago: within the stall tolerance
			s := newScene().dead(2)
			s.f.Assessments[2].Since = s.f.Now.Add(-5 * time.Second)
			return s
		}},
		{ReasonRestartFirst, "m0", func() *scene { // its agent reports, its kubelet fails: systemd's restart first
			s := newScene()
			s.f.Assessments[0] = assess.Assessment{Machine: "m0", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Healthy, EtcdAnswers: true,
				Failing: []string{"kubelet"}, Reasons: []string{"kubelet failing for 20s"}, Since: s.f.Now.Add(-20 * time.Second), Alive: true, LifeAt: s.f.Now}
			return s
		}},
	} {
		t.Run(string(tc.reason), func(t *testing.T) {
			rule := RuleOf(tc.reason)
			s := tc.scene()
			d := s.decide()
			assert.Equal(t, tc.reason, d.holds[tc.machine].Reason, "the pass: %s", d.holds[tc.machine].Why)
			assert.True(t, rule.hub, "every reason holds the hub's own pass")

			// The operator's path, as Reboot takes it: the one admission, with and without --force.
			i := slices.IndexFunc(s.f.Inventory.Machines, func(m Machine) bool { return m.Name == tc.machine })
			m := s.f.Inventory.Machines[i]
			b := Beside{Live: d.cluster}
			_, err := AdmitOperator(s.f, m, OperatorRequest{Strategy: quorum.Reboot}, b)
			forced, ferr := AdmitOperator(s.f, m, OperatorRequest{Strategy: quorum.Reboot, Force: true}, b)
			_, dryErr := AdmitOperator(s.f, m, OperatorRequest{Strategy: quorum.Reboot, DryRun: true}, b)
			if !rule.operator {
				assert.NoError(t, err, "an operator is not held by %s", tc.reason)
				assert.NoError(t, ferr)
				assert.Empty(t, forced.Overrides)
				return
			}
			require.ErrorIs(t, err, ErrRefused, "an operator is held by %s", tc.reason)
			assert.Contains(t, err.Error(), m.Name)
			if !rule.Forceable {
				require.ErrorIs(t, ferr, ErrRefused, "no force overrides %s", tc.reason)
				assert.Equal(t, err.Error(), ferr.Error())
				assert.NoError(t, dryErr, "a dry run shows the plan past %s", tc.reason)
				return
			}
			require.NoError(t, ferr, "--force overrides %s", tc.reason)
			assert.NotEmpty(t, forced.Overrides, "and says what it overrode")
			assert.Contains(t, err.Error(), "--force overrides this")
			assert.ErrorIs(t, dryErr, ErrRefused, "a dry run says the refusal a force would override")
		})
	}
}

// The refusals only an operator meets, through the same admission: each is in RuleOf, holds no pass,
// and no force overrides it; a dry run sees past a standby hub only.
func TestOperatorOnlyHolds(t *testing.T) {
	for _, tc := range []struct {
		reason Reason
		req    OperatorRequest
		beside Beside
		dryRun bool // a dry run shows the plan
	}{
		{ReasonStandby, OperatorRequest{Strategy: quorum.Reboot}, Beside{Standby: "not leading: hub-b holds the Lease"}, true},
		{ReasonInFlight, OperatorRequest{Strategy: quorum.Reboot}, Beside{InFlight: "m2-abc"}, false},
		{ReasonOldQuorum, OperatorRequest{Strategy: quorum.Reboot}, Beside{OldQuorum: "m2 was retired by etcd recovery hale-c0-1 and would run etcd-2 of the old cluster"}, false},
		{ReasonReplaceForced, OperatorRequest{Strategy: quorum.Replace}, Beside{}, true},
	} {
		t.Run(string(tc.reason), func(t *testing.T) {
			rule := RuleOf(tc.reason)
			assert.Equal(t, HoldRule{operator: true}, rule, "the operator's only, never forced")
			s := newScene().dead(2)
			d := s.decide()
			m := s.f.Inventory.Machines[2]
			tc.beside.Live = d.cluster
			force := tc.req
			force.Force = true
			_, err := AdmitOperator(s.f, m, force, tc.beside)
			require.ErrorIs(t, err, ErrRefused, "--force past %s", tc.reason)
			if tc.reason != ReasonReplaceForced { // only --force makes that one
				_, err := AdmitOperator(s.f, m, tc.req, tc.beside)
				require.ErrorIs(t, err, ErrRefused)
				dry := tc.req
				dry.DryRun = true
				got, err := AdmitOperator(s.f, m, dry, tc.beside)
				if tc.dryRun {
					require.NoError(t, err)
					assert.NotEmpty(t, got.Plan.Steps, "the plan a dry run shows")
				} else {
					assert.ErrorIs(t, err, ErrRefused)
				}
			}
		})
	}
}

// A kubeadm upgrade its agent reports is planned work: the hub waits (an operator's reboot does not),
// when policy.plannedWork has it, for at most kubeadmUpgradeFor, and for at most kubeadmUpgradeSilent
// once its agent is silent (a machine that died during an upgrade).
func TestKubeadmUpgradeIsPlannedWork(t *testing.T) {
	for _, tc := range []struct {
		name   string
		since  time.Duration // 0: no upgrade reported
		silent time.Duration // since the agent's last report
		kinds  []string
		who    Asker
		held   bool
	}{
		{"under way for 3 min", 3 * time.Minute, 0, []string{WorkKubeadmUpgrade}, byHub, true},
		{"an operator's reboot", 3 * time.Minute, 0, []string{WorkKubeadmUpgrade}, ByOperator, false},
		{"not in policy.plannedWork", 3 * time.Minute, 0, []string{"cordoned"}, byHub, false},
		{"left behind 2 h ago by an upgrade that failed", 2 * time.Hour, 0, []string{WorkKubeadmUpgrade}, byHub, false},
		{"none reported", 0, 0, []string{WorkKubeadmUpgrade}, byHub, false},
		{"its agent silent for 2 min", 3 * time.Minute, 2 * time.Minute, []string{WorkKubeadmUpgrade}, byHub, true},
		{"its agent silent for 5 min", 10 * time.Minute, 5 * time.Minute, []string{WorkKubeadmUpgrade}, byHub, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScene().dead(2)
			s.f.Inventory.Policy.PlannedWork = tc.kinds
			m := s.f.Inventory.Machines[2]
			if tc.since > 0 {
				r := s.w.Obs.Reports[m.Node]
				r.KubeadmUpgrade, r.SentAt = s.f.Now.Add(-tc.since), s.f.Now.Add(-tc.silent)
				s.w.Obs.Reports[m.Node] = r
			}
			s.f.Observations = s.w.Obs
			holds := MachineHolds(&s.f, &m, &s.f.Assessments[2], Admission{}, tc.who)
			planned := slices.ContainsFunc(holds, func(h Hold) bool {
				return h.Reason == ReasonPlannedWork && strings.Contains(h.Why, "a kubeadm upgrade is replacing "+m.Node+"'s static pod manifests")
			})
			assert.Equal(t, tc.held, planned, "%+v", holds)
			if tc.held && tc.silent > 0 {
				assert.Contains(t, holds[0].Why, "its agent has been silent since", "the hold says how long it lasts")
			}
		})
	}
}

// An operator's reboot of a member nobody can say is healthy or not (its observers gone quiet on a
// loaded machine: HealthUnknown) is checked as a healthy member's: with another member down it is
// refused on quorum, also when every other member looks down too (quorum seemingly lost already,
// where acting on a member that is not healthy costs nothing). A member shown down is still free.
func TestOperatorRebootOfAnUnknownMemberCountsItHealthy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		others quorum.Health // m1's health; m2 is dead
	}{
		{"another member down", quorum.Healthy},
		{"every other member down", quorum.Unhealthy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScene().dead(2)
			d := s.decide()
			live := d.cluster.Clone()
			require.Len(t, live.Members, 3)
			live.Members[live.Index("etcd-0")].Health = quorum.HealthUnknown
			live.Members[live.Index("etcd-1")].Health = tc.others
			for i := range s.f.Assessments { // as the assessor said it then: the few observers left do not reach it
				if s.f.Assessments[i].Machine == "m0" {
					s.f.Assessments[i].EtcdHealth, s.f.Assessments[i].EtcdAnswers = quorum.HealthUnknown, false
				}
			}
			b := Beside{Live: live}
			_, err := AdmitOperator(s.f, s.f.Inventory.Machines[0], OperatorRequest{Strategy: quorum.Reboot}, b)
			require.ErrorIs(t, err, ErrRefused)
			assert.Contains(t, err.Error(), "quorum needs 2")
			_, err = AdmitOperator(s.f, s.f.Inventory.Machines[2], OperatorRequest{Strategy: quorum.Reboot}, b)
			assert.NoError(t, err, "the member shown down: free")
			assert.Equal(t, quorum.HealthUnknown, live.Members[live.Index("etcd-0")].Health, "the caller's cluster is not changed")
		})
	}
}
