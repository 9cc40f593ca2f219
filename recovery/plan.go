// Package recovery rebuilds etcd on its most advanced survivor after a permanent loss of quorum: the
// node-side half of `hub recover` (`agent recover`). It checks every precondition again on the node,
// stops the member, keeps its data directory aside (never deleting it), restores the member's own
// database with upstream etcd's restore (a revision bump, the latest revision marked compacted, a new
// cluster token, so a new cluster ID), and starts it as a one-member cluster. Each step is journaled
// in a state directory and a rerun resumes from the last one; one recovery runs on a node at a time.
package recovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/hale-dev/hale/quorum"
)

// Plan is what the node needs of the hub's recovery plan (`hub recover --yes -o json`): its
// quorum.Rebuild, the same type the hub writes.
type Plan quorum.Rebuild

// ReadPlan reads a plan written by `hub recover --yes -o json` and checks it can be carried out.
func ReadPlan(path string) (Plan, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Plan{}, fmt.Errorf("recovery plan: %w", err)
	}
	var p Plan
	if err := json.Unmarshal(b, &p); err != nil {
		return Plan{}, fmt.Errorf("recovery plan %s: %w (write it with `hub recover --yes -o json > FILE`)", path, err)
	}
	if err := p.Ready(); err != nil {
		return Plan{}, fmt.Errorf("recovery plan %s: %w", path, err)
	}
	return p, nil
}

// Ready says why the plan cannot be carried out on a node (nil: it can).
func (p Plan) Ready() error {
	switch {
	case p.Survivor == nil || p.Survivor.Member == "" || p.Survivor.ClusterID == "":
		return errors.New("it names no survivor (no member answered when it was made)")
	case len(p.Blockers) > 0:
		return fmt.Errorf("it is not ready: %s", strings.Join(p.Blockers, "; "))
	case p.Token == "":
		return errors.New("it has no new cluster token: it was not made by `hub recover --yes`, which fences the lost members first")
	case p.BumpRevision == 0:
		return errors.New("bumpRevision is 0: revisions would go backwards for the API server's watchers")
	}
	for _, f := range p.Fence {
		if !f.Fenced {
			return fmt.Errorf("%s (%s) is not fenced: run `hub recover --yes` again (%s)", f.Machine, f.Member, f.How)
		}
	}
	return nil
}
