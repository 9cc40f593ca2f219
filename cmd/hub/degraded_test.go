package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
