package pass

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/assess/assesstest"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// The out-of-service taint is wanted for a fenced machine only while its BMC, read after the fence and
// recently, finds it Off, the fence is old enough, nobody hears the machine, and nothing else is under
// way on it; each condition that fails for sure takes it away, and what the pass cannot tell yet (no
// BMC read since the fence, a machine Suspect, a fence too recent) leaves it as it is.
func TestOutOfServiceOnlyWhileTheBMCReadsOff(t *testing.T) {
	const fenced = 2
	name := assesstest.Machines()[fenced].Name
	off := func(s *scene, ago time.Duration) {
		s.f.BMCs = map[string]BMCReadiness{name: {Checked: s.f.Now.Add(-ago), Ready: true, Power: bmcval.PowerOff}}
	}
	yes, no := new(true), new(false)
	base := func() *scene {
		s := newScene().dead(fenced).remediated(fenced, quorum.Fence.String(), journal.Succeeded, 2*time.Minute, 1)
		off(s, 10*time.Second)
		return s
	}
	for _, tc := range []struct {
		name  string
		scene func() *scene
		want  *bool // nil: nothing said
	}{
		{"fenced, off for longer than outOfServiceAfter, read Off 10 s ago", base, yes},
		{"fenced 2 min ago by a degraded term's recovery, imported (a note) 5 s ago: counted from the fence", func() *scene {
			s := newScene().dead(fenced)
			at, imported := s.f.Now.Add(-2*time.Minute), s.f.Now.Add(-5*time.Second)
			s.f.History[name] = []Past{PastOf(journal.Remediation{ID: name + "/0", Machine: name, Strategy: quorum.Fence.String(), RequestedBy: "operator",
				State: journal.Succeeded, Created: at, Updated: imported, Steps: []quorum.Step{{Op: quorum.OpPowerOff, Member: "etcd-2"}},
				History: []journal.Entry{{At: at, Kind: journal.EntryOutcome, Result: journal.ResultDone, Detail: "powered off through its BMC"},
					{At: imported, Step: -1, Kind: journal.EntryNote, Detail: "imported from the degraded term's journal"}}})}
			off(s, 3*time.Second)
			return s
		}, yes},
		{"the policy turns it off", func() *scene { s := base(); s.f.Inventory.Policy.OutOfServiceAfter = 0; return s }, no},
		{"fenced 30 s ago: not off long enough", func() *scene {
			s := newScene().dead(fenced).remediated(fenced, quorum.Fence.String(), journal.Succeeded, 30*time.Second, 1)
			off(s, 10*time.Second)
			return s
		}, nil},
		{"the BMC reads On", func() *scene {
			s := base()
			s.f.BMCs[name] = BMCReadiness{Checked: s.f.Now, Ready: true, Power: bmcval.PowerOn}
			return s
		}, no},
		{"the BMC cannot be read", func() *scene {
			s := base()
			s.f.BMCs[name] = BMCReadiness{Checked: s.f.Now, Problem: bmcval.ProblemUnreachable, Error: "dial tcp: timeout"}
			return s
		}, no},
		{"the last Off read, after the fence, is 2 min old", func() *scene {
			s := newScene().dead(fenced).remediated(fenced, quorum.Fence.String(), journal.Succeeded, 3*time.Minute, 1)
			off(s, 2*time.Minute)
			return s
		}, no},
		{"no BMC read since the fence (the Off read 70 s ago is from before it)", func() *scene {
			s := newScene().dead(fenced).remediated(fenced, quorum.Fence.String(), journal.Succeeded, time.Minute, 1)
			s.f.Inventory.Policy.OutOfServiceAfter = 30 * time.Second
			off(s, 70*time.Second)
			return s
		}, nil},
		{"no BMC read yet (a leader just started)", func() *scene { s := base(); s.f.BMCs = nil; return s }, nil},
		{"Suspect", func() *scene { s := base(); s.f.Assessments[fenced].Verdict = assess.VerdictSuspect; return s }, nil},
		{"detached", func() *scene { s := base(); s.f.Detached[name] = Brake{By: "operator alice"}; return s }, no},
		{"a remediation in flight (an operator's reboot powers it on)", func() *scene { s := base(); s.f.Flights[name] = Flight{}; return s }, no},
		{"heard again", func() *scene { s := base(); s.f.Assessments[fenced].Verdict = assess.VerdictHealthy; return s }, no},
		{"its last remediation a reboot, not a fence", func() *scene {
			s := base().remediated(fenced, quorum.Reboot.String(), journal.Succeeded, time.Minute, 1)
			return s
		}, no},
		{"the fence failed", func() *scene {
			s := newScene().dead(fenced).remediated(fenced, quorum.Fence.String(), journal.Failed, 2*time.Minute, 1)
			off(s, 10*time.Second)
			return s
		}, no},
		{"no Node", func() *scene { s := base(); s.f.Inventory.Machines[fenced].Node = ""; return s }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := OutOfService(tc.scene().f)
			why, on := got.On[name]
			switch {
			case tc.want == nil:
				assert.True(t, got.Keep[name] || !hasNode(tc.scene(), name), "kept: %+v", got)
				assert.False(t, on)
			case *tc.want:
				assert.True(t, on)
				assert.False(t, got.Keep[name])
				assert.Contains(t, why, "fenced by remediation "+name+"/0")
				assert.Contains(t, why, "its BMC read the power Off at")
			default:
				assert.False(t, on, "off")
				assert.False(t, got.Keep[name], "off")
			}
		})
	}
}

// A pass that only listens, or a paused or suspended hub, changes no taint (nil); a planning pass
// hands apply what it says of each machine.
func TestComputeHandsOutOfServiceOnlyWhenActing(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Facts)
		want bool
	}{
		{"planning", func(*Facts) {}, true},
		{"listening", func(f *Facts) { f.Listen = "standing by" }, false},
		{"paused", func(f *Facts) { f.Paused = "operator alice" }, false},
		{"suspended", func(f *Facts) { f.Suspended = true }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScene()
			f := s.stepFacts()
			tc.set(&f)
			_, rd := Compute(NewState(), f)
			assert.Equal(t, tc.want, rd.OutOfService != nil)
		})
	}
}

// hasNode says whether the scene's machine name has a Node.
func hasNode(s *scene, name string) bool {
	m, ok := s.f.Inventory.Machine(name)
	return ok && m.Node != ""
}
