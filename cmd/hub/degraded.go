package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/pass"
)

// Degraded mode's rules are package hub/degraded's; kube.Degraded runs its terms.

// checkDegradedFlags checks degraded mode's flags before the hub starts: the journal's directory
// exists, the break-glass inventory reads (with its credentials files).
func checkDegradedFlags(k *kubeOptions) (*pass.Inventory, error) {
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
	inv, err := inventory.Load(k.breakGlass)
	if err != nil {
		return nil, fmt.Errorf("--break-glass-inventory: %w", err)
	}
	return &inv, nil
}
