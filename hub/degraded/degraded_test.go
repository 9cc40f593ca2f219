package degraded

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

var t0 = time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)

// The lease's arithmetic: a retry is a tenth of the lease; the authority is the lease less half a
// retry (with the default 15 s lease: 1.5 s and 14.25 s).
func TestLeaseTiming(t *testing.T) {
	l := Lease{Duration: 15 * time.Second}
	assert.Equal(t, 1500*time.Millisecond, l.Retry())
	assert.Equal(t, 14250*time.Millisecond, l.Authority())
}

// A leader that lost its Lease acts alone only with quorum lost, the API server silent, and its
// own lease still its own by its clock when it decides (after the probe).
func TestEnter(t *testing.T) {
	l := Lease{Duration: 15 * time.Second}
	lost := Loss{Quorum: pass.QuorumLost, QuorumWhy: "etcd: 1 of 3 voters healthy", Renewed: t0, Now: t0.Add(10 * time.Second)}
	for _, tc := range []struct {
		name  string
		edit  func(*Loss)
		enter bool
		why   string
	}{
		{name: "quorum lost, API silent, lease held 10 s of 14.25: enters", edit: func(*Loss) {}, enter: true},
		{name: "at the authority's last instant: enters", edit: func(s *Loss) { s.Now = t0.Add(l.Authority()) }, enter: true},
		{name: "a nanosecond past the authority: another replica may hold it", edit: func(s *Loss) { s.Now = t0.Add(l.Authority() + 1) },
			why: "more than this leader's authority (14.25s)"},
		{name: "never renewed", edit: func(s *Loss) { s.Renewed = time.Time{} }, why: "another replica may hold it"},
		{name: "the API server answers: deposed or back", edit: func(s *Loss) { s.APIAnswers = true }, why: "the API server answers"},
		{name: "quorum held", edit: func(s *Loss) { s.Quorum, s.QuorumWhy = pass.QuorumHeld, "etcd: 3 of 3" }, why: "not entering degraded mode: etcd: 3 of 3"},
		{name: "quorum unknown (no majority of observers)", edit: func(s *Loss) { s.Quorum, s.QuorumWhy = pass.QuorumUnknown, "the hub hears 1 of 4" },
			why: "the hub hears 1 of 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := lost
			tc.edit(&s)
			ok, why := l.Enter(s)
			assert.Equal(t, tc.enter, ok)
			if tc.why != "" {
				assert.Contains(t, why, tc.why)
			}
		})
	}
}

// A term left in the term file is continued only while the API server is silent and the term's
// authority (from the API server's last failure to answer) lasts.
func TestContinue(t *testing.T) {
	l := Lease{Duration: 15 * time.Second}
	term := Term{Identity: "hub-a", Epoch: 3, Unreachable: t0}
	for _, tc := range []struct {
		name    string
		answers bool
		now     time.Time
		ok      bool
		why     string
	}{
		{name: "silent, 5 s after the last failure", now: t0.Add(5 * time.Second), ok: true},
		{name: "silent, at the authority's end", now: t0.Add(l.Authority()), ok: true},
		{name: "silent, past the authority", now: t0.Add(l.Authority() + time.Millisecond), why: "its authority has lapsed"},
		{name: "the API server answers", answers: true, now: t0.Add(time.Second), why: "its journal is imported once this replica leads"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, why := l.Continue(term, tc.answers, tc.now)
			assert.Equal(t, tc.ok, ok)
			if tc.why != "" {
				assert.Contains(t, why, tc.why)
			}
		})
	}
}

// A degraded hub starts nothing new once its authority lapsed or etcd's quorum is back.
func TestStandby(t *testing.T) {
	l := Lease{Duration: 15 * time.Second}
	assert.Empty(t, l.Standby(t0, t0.Add(time.Second), ""))
	assert.Contains(t, l.Standby(t0, t0.Add(20*time.Second), ""), "longer than this term's authority")
	assert.Contains(t, l.Standby(t0, t0.Add(time.Second), "etcd: 3 of 3"), "etcd has quorum again (etcd: 3 of 3): nothing new starts")
	assert.Contains(t, l.Standby(t0, t0.Add(20*time.Second), "etcd: 3 of 3"), "authority", "the lapse is said first")
}

// A new term records the leader, the epoch, why, and the inventory's machines and witnesses.
func TestNewTerm(t *testing.T) {
	inv := pass.Inventory{Witnesses: []string{"w-0"}, Machines: []pass.Machine{{MachineRef: assess.MachineRef{Name: "cp-0", Node: "n0", Member: "e0"}, Pool: "cp", Hold: "h"}}}
	term := NewTerm("hub-a", 4, t0, "quorum lost", inv)
	assert.Equal(t, Term{Identity: "hub-a", Epoch: 4, Since: t0, Unreachable: t0, Why: "quorum lost", Witnesses: []string{"w-0"},
		Machines: []TermMachine{{Name: "cp-0", Node: "n0", Member: "e0", Pool: "cp", Hold: "h"}}}, term)
}

// A degraded term keeps the last leader's machines and witnesses (the expected observers do not
// change), takes each machine's BMC from the break-glass inventory and heals by power only; a machine
// it does not list, or one held before, is held.
func TestInventory(t *testing.T) {
	ep, err := bmc.ParseEndpoint("redfish://10.0.0.12")
	require.NoError(t, err)
	creds := bmc.NewCredentials("hale", "s3cret")
	last := pass.Inventory{Cluster: "prod", Witnesses: []string{"w-0", "w-1"}, Machines: []pass.Machine{
		{MachineRef: assess.MachineRef{Name: "cp-0", Node: "cp-0", Member: "cp-0"}, Strategy: quorum.Replace,
			Replace: quorum.ReplaceOptions{Orders: []quorum.Order{quorum.ScaleDownFirst}}},
		{MachineRef: assess.MachineRef{Name: "cp-1", Node: "cp-1", Member: "cp-1"}, Strategy: quorum.Reboot, Hold: "BareMetalHost detached"},
		{MachineRef: assess.MachineRef{Name: "cp-2", Node: "cp-2"}, Strategy: quorum.Replace},
	}}
	breakGlass := &pass.Inventory{Cluster: "other", Machines: []pass.Machine{
		{MachineRef: assess.MachineRef{Name: "cp-1", Member: "cp-1"}, Strategy: quorum.Reboot, Endpoint: ep, Credentials: creds},
		{MachineRef: assess.MachineRef{Name: "cp-2", Member: "etcd-cp-2"}, Strategy: quorum.Reboot, Endpoint: ep, Credentials: creds},
	}}
	inv := Inventory(last, breakGlass)
	assert.Equal(t, "prod", inv.Cluster)
	assert.Equal(t, []string{"w-0", "w-1"}, inv.Witnesses)
	require.Len(t, inv.Machines, 3)
	assert.Contains(t, inv.Machines[0].Hold, "not in the break-glass inventory")
	assert.Empty(t, inv.Machines[0].Replace.Orders, "no owner in degraded mode")
	assert.Equal(t, "BareMetalHost detached", inv.Machines[1].Hold, "a hold stays")
	assert.Equal(t, quorum.Reboot, inv.Machines[2].Strategy)
	assert.Equal(t, ep, inv.Machines[2].Endpoint)
	assert.Equal(t, "s3cret", inv.Machines[2].Credentials.Password())
	assert.Equal(t, "etcd-cp-2", inv.Machines[2].Member, "the member from the break-glass inventory when the term had none")
	assert.Equal(t, quorum.Replace, last.Machines[0].Strategy, "the last term's inventory is not changed")

	inv = Inventory(last, nil)
	assert.Equal(t, quorum.Replace, inv.Machines[0].Strategy, "without break-glass: held by PowerFor and OwnerFor, with their reasons")
	assert.Empty(t, inv.Machines[0].Hold)
}

// The brakes in force when the API server was lost go on in the degraded term, and a machine whose
// remediation through the API server is in flight is detached until it answers.
func TestSnapshotBrakes(t *testing.T) {
	since := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	st := operator.Status{Time: since.Add(time.Hour),
		PausedBy:    []pass.Brake{{By: "alice", Reason: "upgrade", Since: since}, {By: "Cluster prod/prod", Reason: "paused", Since: since}},
		SuspendedBy: &pass.Brake{By: "bob", Since: since},
		Machines: []operator.MachineStatus{
			{Name: "cp-0"},
			{Name: "cp-1", Detached: true, DetachedBy: &pass.Brake{By: "carol", Reason: "disk swap", Since: since}},
			{Name: "cp-2", Remediation: &operator.InFlight{ID: "cp-2-0abc", Strategy: "replace"}},
		}}
	b := SnapshotBrakes(st)
	require.NotNil(t, b.Paused)
	assert.Equal(t, "alice", b.Paused.By)
	assert.Contains(t, b.Paused.Reason, "Cluster prod/prod")
	assert.Equal(t, st.SuspendedBy, b.Suspended)
	assert.Equal(t, "carol", b.Detached["cp-1"].By)
	assert.Contains(t, b.Detached["cp-2"].Reason, "remediation cp-2-0abc (replace), begun through the API server, is in flight")
	assert.NotContains(t, b.Detached, "cp-0")
	assert.Nil(t, SnapshotBrakes(operator.Status{}).Paused)
}

// The term file: written atomically, read back whole; none is nil; an unreadable one names itself
// and what to do.
func TestTermFile(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal.db")
	got, err := ReadTerm(journal)
	require.NoError(t, err)
	assert.Nil(t, got)
	want := Term{Identity: "hub-a", Epoch: 7, Since: time.Now().UTC().Truncate(time.Second), Why: "etcd: quorum lost",
		Unreachable: time.Now().UTC().Truncate(time.Second), Witnesses: []string{"w-0"},
		Machines: []TermMachine{{Name: "cp-0", Node: "cp-0", Member: "cp-0", Hold: "held"}}}
	require.NoError(t, WriteTerm(journal, want))
	got, err = ReadTerm(journal)
	require.NoError(t, err)
	assert.Equal(t, want, *got)
	inv := TermInventory(pass.Inventory{Cluster: "prod"}, *got)
	assert.Equal(t, "prod", inv.Cluster)
	assert.Equal(t, []string{"w-0"}, inv.Witnesses)
	assert.Equal(t, "held", inv.Machines[0].Hold)

	require.NoError(t, os.WriteFile(TermPath(journal), []byte("{"), 0o600))
	_, err = ReadTerm(journal)
	require.Error(t, err)
	assert.Contains(t, err.Error(), TermPath(journal))
	assert.Contains(t, err.Error(), "move it aside")
}
