package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/quorum"
)

// A degraded term keeps the last leader's machines and witnesses (the expected observers do not
// change), takes each machine's BMC from the break-glass inventory and heals by power only; a machine
// it does not list, or one held before, is held.
func TestDegradedInventory(t *testing.T) {
	ep, err := bmc.ParseEndpoint("redfish://10.0.0.12")
	require.NoError(t, err)
	creds := bmc.NewCredentials("hale", "s3cret")
	last := hub.Inventory{Cluster: "prod", Witnesses: []string{"w-0", "w-1"}, Machines: []hub.Machine{
		{MachineRef: hub.MachineRef{Name: "cp-0", Node: "cp-0", Member: "cp-0"}, Strategy: quorum.Replace,
			Replace: quorum.ReplaceOptions{Orders: []quorum.Order{quorum.ScaleDownFirst}}},
		{MachineRef: hub.MachineRef{Name: "cp-1", Node: "cp-1", Member: "cp-1"}, Strategy: quorum.Reboot, Hold: "BareMetalHost detached"},
		{MachineRef: hub.MachineRef{Name: "cp-2", Node: "cp-2"}, Strategy: quorum.Replace},
	}}
	breakGlass := &hub.Inventory{Cluster: "other", Machines: []hub.Machine{
		{MachineRef: hub.MachineRef{Name: "cp-1", Member: "cp-1"}, Strategy: quorum.Reboot, Endpoint: ep, Credentials: creds},
		{MachineRef: hub.MachineRef{Name: "cp-2", Member: "etcd-cp-2"}, Strategy: quorum.Reboot, Endpoint: ep, Credentials: creds},
	}}
	inv := degradedInventory(last, breakGlass)
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

	inv = degradedInventory(last, nil)
	assert.Equal(t, quorum.Replace, inv.Machines[0].Strategy, "without break-glass: held by PowerFor and OwnerFor, with their reasons")
	assert.Empty(t, inv.Machines[0].Hold)
}

// The brakes in force when the API server was lost go on in the degraded term, and a machine whose
// remediation through the API server is in flight is detached until it answers.
func TestSnapshotBrakes(t *testing.T) {
	since := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	st := hub.Status{Time: since.Add(time.Hour),
		PausedBy:    []hub.Brake{{By: "alice", Reason: "upgrade", Since: since}, {By: "Cluster prod/prod", Reason: "paused", Since: since}},
		SuspendedBy: &hub.Brake{By: "bob", Since: since},
		Machines: []hub.MachineStatus{
			{Name: "cp-0"},
			{Name: "cp-1", Detached: true, DetachedBy: &hub.Brake{By: "carol", Reason: "disk swap", Since: since}},
			{Name: "cp-2", Remediation: &hub.InFlight{ID: "cp-2-0abc", Strategy: "replace"}},
		}}
	b := snapshotBrakes(st)
	require.NotNil(t, b.Paused)
	assert.Equal(t, "alice", b.Paused.By)
	assert.Contains(t, b.Paused.Reason, "Cluster prod/prod")
	assert.Equal(t, st.SuspendedBy, b.Suspended)
	assert.Equal(t, "carol", b.Detached["cp-1"].By)
	assert.Contains(t, b.Detached["cp-2"].Reason, "remediation cp-2-0abc (replace), begun through the API server, is in flight")
	assert.NotContains(t, b.Detached, "cp-0")
	assert.Nil(t, snapshotBrakes(hub.Status{}).Paused)
}

// The term file: written atomically, read back whole; none is nil; an unreadable one names itself
// and what to do.
func TestTermFile(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal.db")
	got, err := readTerm(journal)
	require.NoError(t, err)
	assert.Nil(t, got)
	want := degradedTerm{Identity: "hub-a", Epoch: 7, Since: time.Now().UTC().Truncate(time.Second), Why: "etcd: quorum lost",
		Unreachable: time.Now().UTC().Truncate(time.Second), Witnesses: []string{"w-0"},
		Machines: []termMachine{{Name: "cp-0", Node: "cp-0", Member: "cp-0", Hold: "held"}}}
	require.NoError(t, writeTerm(journal, want))
	got, err = readTerm(journal)
	require.NoError(t, err)
	assert.Equal(t, want, *got)
	inv := termInventory(hub.Inventory{Cluster: "prod"}, *got)
	assert.Equal(t, "prod", inv.Cluster)
	assert.Equal(t, []string{"w-0"}, inv.Witnesses)
	assert.Equal(t, "held", inv.Machines[0].Hold)

	require.NoError(t, os.WriteFile(termPath(journal), []byte("{"), 0o600))
	_, err = readTerm(journal)
	require.Error(t, err)
	assert.Contains(t, err.Error(), termPath(journal))
	assert.Contains(t, err.Error(), "move it aside")
}

// Degraded mode's flags are checked before the hub starts, each error naming the flag and the fix.
func TestDegradedFlags(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	require.NoError(t, os.WriteFile(creds, []byte("username=hale\npassword=x\n"), 0o600))
	good := filepath.Join(dir, "bg.yaml")
	require.NoError(t, os.WriteFile(good, []byte("cluster: prod\nclasses: {cp: {strategy: reboot}}\nmachines:\n"+
		"  - {name: cp-0, member: cp-0, class: cp, bmc: {endpoint: \"redfish://10.0.0.1\", credentials: "+creds+"}}\n"), 0o600))
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("cluster: prod\nmachines: []\n"), 0o600))
	journal := filepath.Join(dir, "degraded.db")
	for _, tc := range []struct {
		name       string
		k          kubeOptions
		err        string
		breakGlass bool
	}{
		{name: "off", k: kubeOptions{}},
		{name: "on, no break-glass", k: kubeOptions{degradedJournal: journal}},
		{name: "on, break-glass", k: kubeOptions{degradedJournal: journal, breakGlass: good}, breakGlass: true},
		{name: "break-glass alone", k: kubeOptions{breakGlass: good}, err: "--break-glass-inventory needs --degraded-journal"},
		{name: "no directory", k: kubeOptions{degradedJournal: filepath.Join(dir, "missing", "j.db")}, err: "its directory must exist"},
		{name: "bad break-glass", k: kubeOptions{degradedJournal: journal, breakGlass: bad}, err: "--break-glass-inventory: inventory " + bad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := checkDegradedFlags(&tc.k)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.breakGlass, inv != nil)
		})
	}
}
