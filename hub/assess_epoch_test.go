package hub

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/hale-dev/hale/quorum"
)

// answering sets what node's own agent says of its member's status: it answers (as member id of
// cluster), or not (id "").
func (w *world) answering(node, id, cluster string) *world {
	r := w.obs.Reports[node]
	e := *r.Etcd
	e.LocalID, e.ClusterID = id, cluster
	r.Etcd = &e
	w.obs.Reports[node] = r
	return w
}

// version sets node's report version.
func (w *world) version(node string, v uint64) *world {
	r := w.obs.Reports[node]
	r.Version = v
	w.obs.Reports[node] = r
	return w
}

// DESIGN.md rule 12: an observer's "does not answer" counts against a member only in a report sent
// after the member's latest (re)start or change of cluster, and the unreachable time counts from that
// moment at the earliest. Found on real processes after `agent recover`: the rebuilt cluster's only
// member answered, its observers' reports still said it did not, and 5 s later it was power-cycled.
func TestEvidenceFromBeforeAMemberRestartsIsNoEvidence(t *testing.T) {
	for _, tc := range []struct {
		name       string
		restart    func(w *world) *world
		epochWords string
	}{
		{"it answers again", func(w *world) *world { return w.answering("cp-0", "a0", "c1") }, "etcd-0 answered again"},
		{"it answers in another cluster", func(w *world) *world { return w.answering("cp-0", "b0", "c2") }, "etcd-0 answered as a member of etcd cluster c2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := t0.Add(time.Hour)
			a := hearing(DefaultAssessPolicy())
			before := func(at time.Time) *world {
				w := newWorld(at).versioned(1).unreachable("etcd-0", "cp-0", "cp-1", "cp-2")
				if tc.epochWords == "etcd-0 answered again" {
					return w.answering("cp-0", "", "")
				}
				return w.answering("cp-0", "a0", "c1")
			}
			// Down for a minute: unreachable from every observer, Unhealthy.
			a.Assess(machines, nil, before(now.Add(-time.Minute)).obs)
			got := byName(a.Assess(machines, nil, before(now).version("cp-0", 2).obs))["m0"]
			assert.Equal(t, VerdictUnhealthy, got.Verdict, "%q", got.Reasons)

			// It (re)starts: its own agent says so at once; the others' reports are from before.
			back := tc.restart(before(now.Add(time.Second)).version("cp-0", 3))
			got = byName(a.Assess(machines, nil, back.obs))["m0"]
			assert.Equal(t, VerdictSuspect, got.Verdict, "%q", got.Reasons)
			assert.Contains(t, joinLines(got.Reasons), "reports from before "+tc.epochWords+" say it does not answer")
			assert.True(t, got.OwnAnswers)
			assert.Equal(t, quorum.Healthy, got.EtcdHealth, "its own word, with no newer vote against it")

			// Newer reports that still do not reach it (the observers' clients still dialling it again):
			// counted from the first of them, not from a minute ago.
			lag := tc.restart(before(now.Add(3 * time.Second)).versioned(4))
			got = byName(a.Assess(machines, nil, lag.obs))["m0"]
			assert.Equal(t, VerdictSuspect, got.Verdict, "%q", got.Reasons)
			assert.Contains(t, joinLines(got.Reasons), "unreachable from 3 of 3 expected observers for 0s")

			// Still unreachable in newer reports for the whole timeout: judged as usual.
			still := tc.restart(before(now.Add(8 * time.Second)).versioned(5))
			got = byName(a.Assess(machines, nil, still.obs))["m0"]
			assert.Equal(t, VerdictUnhealthy, got.Verdict, "%q", got.Reasons)

			// Reached in newer reports: Healthy, and counted as reached since the epoch.
			reached := tc.restart(newWorld(now.Add(9 * time.Second)).versioned(6))
			got = byName(a.Assess(machines, nil, reached.obs))["m0"]
			assert.Equal(t, VerdictHealthy, got.Verdict, "%q", got.Reasons)
			assert.Equal(t, 3, got.EtcdReachedSince)
		})
	}
}

// An agent that started again (its machine rebooted) starts an epoch too; a report that says nothing
// new does not, and neither does a member's first report (the hub's own start is heardSince's).
func TestEpochsStartOnlyOnAChange(t *testing.T) {
	now := t0.Add(time.Hour)
	a := hearing(DefaultAssessPolicy())
	w := newWorld(now).versioned(1).answering("cp-0", "a0", "c1")
	a.Assess(machines, nil, w.obs)
	assert.Empty(t, a.epochs, "first sight")
	a.Assess(machines, nil, w.version("cp-0", 2).obs)
	assert.Empty(t, a.epochs, "nothing new")
	r := w.obs.Reports["cp-0"]
	r.Started, r.Version = now, 3
	w.obs.Reports["cp-0"] = r
	a.Assess(machines, nil, w.obs)
	assert.Equal(t, "cp-0's agent started again", a.epochs["etcd-0"].why)
	assert.Equal(t, uint64(1), a.epochs["etcd-0"].versions["cp-1"])
}
