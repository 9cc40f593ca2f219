package assess_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/assess/assesstest"
	"github.com/hale-dev/hale/quorum"
)

// DESIGN.md rule 12: an observer's "does not answer" counts against a member only in a report sent
// after the member's latest (re)start or change of cluster, and the unreachable time counts from that
// moment at the earliest. Found on real processes after `agent recover`: the rebuilt cluster's only
// member answered, its observers' reports still said it did not, and 5 s later it was power-cycled.
func TestEvidenceFromBeforeAMemberRestartsIsNoEvidence(t *testing.T) {
	for _, tc := range []struct {
		name       string
		restart    func(w *assesstest.World) *assesstest.World
		epochWords string
	}{
		{"it answers again", func(w *assesstest.World) *assesstest.World { return w.Answering("cp-0", "a0", "c1") }, "etcd-0 answered again"},
		{"it answers in another cluster", func(w *assesstest.World) *assesstest.World { return w.Answering("cp-0", "b0", "c2") }, "etcd-0 answered as a member of etcd cluster c2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := assesstest.T0().Add(time.Hour)
			a := assesstest.Hearing(assess.DefaultPolicy())
			before := func(at time.Time) *assesstest.World {
				w := assesstest.NewWorld(at).Versioned(1).Unreachable("etcd-0", "cp-0", "cp-1", "cp-2")
				if tc.epochWords == "etcd-0 answered again" {
					return w.Answering("cp-0", "", "")
				}
				return w.Answering("cp-0", "a0", "c1")
			}
			// Down for a minute: unreachable from every observer, Unhealthy.
			a.Assess(assesstest.Machines(), nil, before(now.Add(-time.Minute)).Obs)
			got := assesstest.ByName(a.Assess(assesstest.Machines(), nil, before(now).Version("cp-0", 2).Obs))["m0"]
			assert.Equal(t, assess.VerdictUnhealthy, got.Verdict, "%q", got.Reasons)

			// It (re)starts: its own agent says so at once; the others' reports are from before.
			back := tc.restart(before(now.Add(time.Second)).Version("cp-0", 3))
			got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, back.Obs))["m0"]
			assert.Equal(t, assess.VerdictSuspect, got.Verdict, "%q", got.Reasons)
			assert.Contains(t, joinLines(got.Reasons), "reports from before "+tc.epochWords+" say it does not answer")
			assert.True(t, got.OwnAnswers)
			assert.Equal(t, quorum.Healthy, got.EtcdHealth, "its own word, with no newer vote against it")

			// Newer reports that still do not reach it (the observers' clients still dialling it again):
			// counted from the first of them, not from a minute ago.
			lag := tc.restart(before(now.Add(3 * time.Second)).Versioned(4))
			got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, lag.Obs))["m0"]
			assert.Equal(t, assess.VerdictSuspect, got.Verdict, "%q", got.Reasons)
			assert.Contains(t, joinLines(got.Reasons), "unreachable from 3 of 3 expected observers for 0s")

			// Still unreachable in newer reports for the whole timeout: judged as usual.
			still := tc.restart(before(now.Add(8 * time.Second)).Versioned(5))
			got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, still.Obs))["m0"]
			assert.Equal(t, assess.VerdictUnhealthy, got.Verdict, "%q", got.Reasons)

			// Reached in newer reports: Healthy, and counted as reached since the epoch.
			reached := tc.restart(assesstest.NewWorld(now.Add(9 * time.Second)).Versioned(6))
			got = assesstest.ByName(a.Assess(assesstest.Machines(), nil, reached.Obs))["m0"]
			assert.Equal(t, assess.VerdictHealthy, got.Verdict, "%q", got.Reasons)
			assert.Equal(t, 3, got.EtcdReachedSince)
		})
	}
}

// An agent that started again (its machine rebooted) starts an epoch too; a report that says nothing
// new does not, and neither does a member's first report (the hub's own start is heardSince's).
func TestEpochsStartOnlyOnAChange(t *testing.T) {
	now := assesstest.T0().Add(time.Hour)
	a := assesstest.Hearing(assess.DefaultPolicy())
	w := assesstest.NewWorld(now).Versioned(1).Answering("cp-0", "a0", "c1")
	a.Assess(assesstest.Machines(), nil, w.Obs)
	assert.Zero(t, assess.Epochs(a), "first sight")
	a.Assess(assesstest.Machines(), nil, w.Version("cp-0", 2).Obs)
	assert.Zero(t, assess.Epochs(a), "nothing new")
	r := w.Obs.Reports["cp-0"]
	r.Started, r.Version = now, 3
	w.Obs.Reports["cp-0"] = r
	a.Assess(assesstest.Machines(), nil, w.Obs)
	why, versions := assess.EpochOf(a, "etcd-0")
	assert.Equal(t, "cp-0's agent started again", why)
	assert.Equal(t, uint64(1), versions["cp-1"])
}
