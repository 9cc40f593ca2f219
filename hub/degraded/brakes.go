package degraded

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/pass"
)

// ImportBrakes carries the brakes a degraded term recorded back into the HealthPolicy (store): each
// one the policy lacks is added, who set it and why kept; none is lifted. The pause `hub recover
// --yes` set holds until `hub resume`, as in standalone mode. It returns what it added.
func ImportBrakes(ctx context.Context, store hub.BrakeStore, term pass.Brakes) ([]string, error) {
	b, err := store.LoadBrakes(ctx)
	if err != nil {
		return nil, err
	}
	var added []string
	for _, f := range []struct {
		what       string
		from, into **pass.Brake
	}{{"paused", &term.Paused, &b.Paused}, {"suspended", &term.Suspended, &b.Suspended}} {
		if *f.from != nil && *f.into == nil {
			*f.into = *f.from
			added = append(added, fmt.Sprintf("%s by %s", f.what, **f.from))
		}
	}
	for _, m := range slices.Sorted(maps.Keys(term.Detached)) {
		if _, ok := b.Detached[m]; !ok {
			if b.Detached == nil {
				b.Detached = map[string]pass.Brake{}
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
