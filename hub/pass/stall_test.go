package pass

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/assess/assesstest"
	"github.com/hale-dev/hale/quorum"
)

// withBMC gives machine i a Redfish BMC (the scene's machines have none).
func (s *scene) withBMC(i int) *scene {
	ep, err := bmcval.ParseEndpoint(fmt.Sprintf("redfish://bmc-%d.example", i))
	if err != nil {
		panic(err)
	}
	s.f.Inventory.Machines[i].Endpoint = ep
	return s
}

// deadFor makes machine i dead, its last sign of life ago.
func (s *scene) deadFor(i int, ago time.Duration) *scene {
	s.dead(i)
	s.f.Assessments[i].Since = s.f.Now.Add(-ago + time.Second) // declared dead a second after its last sign
	if s.f.lifeAt == nil {
		s.f.lifeAt = map[string]time.Time{}
	}
	s.f.lifeAt[s.f.Inventory.Machines[i].Name] = s.f.Now.Add(-ago)
	return s
}

// reportedAgo makes the latest reports of machines is ago old.
func (s *scene) reportedAgo(ago time.Duration, is ...int) *scene {
	for _, i := range is {
		node := assesstest.Machines()[i].Node
		r := s.w.Obs.Reports[node]
		r.SentAt = s.f.Now.Add(-ago)
		s.w.Obs.Reports[node] = r
	}
	return s
}

// gone makes machine i Suspect with its agent gone per a majority (assess.Assessment.Gone): the
// assessor waits for newer views of its member.
func (s *scene) gone(i int) *scene {
	m := s.f.Inventory.Machines[i]
	s.f.Assessments[i] = assess.Assessment{Machine: m.Name, Verdict: assess.VerdictSuspect, EtcdHealth: quorum.HealthUnknown, Gone: true,
		Reasons: []string{"its agent is gone; waiting for newer views of its member"}, Since: s.f.Now.Add(-time.Second)}
	return s
}

// failingFor makes machine i's agent report its probe failing for ago (its member healthy).
func (s *scene) failingFor(i int, probe string, ago time.Duration) *scene {
	m := s.f.Inventory.Machines[i]
	s.f.Assessments[i] = assess.Assessment{Machine: m.Name, Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Healthy, EtcdAnswers: true,
		Failing: []string{probe}, Reasons: []string{probe + " failing"}, Since: s.f.Now.Add(-ago), Alive: true, LifeAt: s.f.Now}
	return s
}

// bmcRead says what machine i's BMC read ago.
func (s *scene) bmcRead(i int, ago time.Duration, r BMCReadiness) *scene {
	if s.f.BMCs == nil {
		s.f.BMCs = map[string]BMCReadiness{}
	}
	r.Ready, r.Checked = true, s.f.Now.Add(-ago)
	s.f.BMCs[s.f.Inventory.Machines[i].Name] = r
	return s
}

// The verdict is not the action: each case is one pass's decision about m2 (and m1), as the stall
// tolerance, the component grace and the BMC's proof say.
func TestStallToleranceAndProof(t *testing.T) {
	hang := func(ago time.Duration) bmcval.LogEntry {
		return bmcval.LogEntry{ID: "7", Kind: bmcval.HangOSCriticalStop, Message: "OS Critical Stop #0x01: Run-time critical stop : Asserted", At: newScene().f.Now.Add(-ago)}
	}
	for _, tc := range []struct {
		name  string
		scene func() *scene
		// starts: begun, each with its grounds in its reason; held: by reason, with words in its why.
		starts  map[string]string
		held    map[string]Reason
		why     string
		watched []string
	}{
		{name: "dead 5 s, quorum held: it may resume; its BMC is watched", scene: func() *scene { return newScene().withBMC(2).deadFor(2, 5*time.Second) },
			held: map[string]Reason{"m2": ReasonMayResume}, why: "stallTolerance 30s: etcd keeps quorum without it), at once if its BMC proves a hang", watched: []string{"m2"}},
		{name: "dead 29 s: still within", scene: func() *scene { return newScene().withBMC(2).deadFor(2, 29*time.Second) },
			held: map[string]Reason{"m2": ReasonMayResume}, watched: []string{"m2"}},
		{name: "dead 30 s, declared dead 29 s ago: still within (counted from the verdict when it is later)", scene: func() *scene { return newScene().withBMC(2).deadFor(2, 30*time.Second) },
			held: map[string]Reason{"m2": ReasonMayResume}, watched: []string{"m2"}},
		{name: "dead 31 s: past the tolerance", scene: func() *scene { return newScene().withBMC(2).deadFor(2, 31*time.Second) },
			starts: map[string]string{"m2": "no sign of life for 31s, past its stall tolerance of 30s (etcd keeps quorum without it)"}},
		{name: "declared dead a minute ago, but a sign of life 5 s ago: counted from the sign", scene: func() *scene {
			s := newScene().withBMC(2).deadFor(2, time.Minute)
			s.f.lifeAt["m2"] = s.f.Now.Add(-5 * time.Second)
			return s
		}, held: map[string]Reason{"m2": ReasonMayResume}, watched: []string{"m2"}},
		{name: "no BMC: the tolerance alone, said", scene: func() *scene { return newScene().deadFor(2, 5*time.Second) },
			held: map[string]Reason{"m2": ReasonMayResume}, why: "it has no BMC whose word could prove a hang sooner"},
		{name: "two of three dead 9 s: needed for quorum, 10 s", scene: func() *scene {
			return newScene().witnesses("w-0", "w-1").withBMC(1).withBMC(2).deadFor(1, 9*time.Second).deadFor(2, 9*time.Second)
		}, held: map[string]Reason{"m1": ReasonMayResume, "m2": ReasonMayResume}, why: "stallTolerance 10s: its member is needed for etcd's quorum", watched: []string{"m1", "m2"}},
		{name: "two of three dead 12 s, the witnesses' reports a second old: both begin", scene: func() *scene {
			return newScene().witnesses("w-0", "w-1").withBMC(1).withBMC(2).deadFor(1, 12*time.Second).deadFor(2, 12*time.Second)
		}, starts: map[string]string{"m1": "past its stall tolerance of 10s (its member is needed for etcd's quorum)", "m2": "past its stall tolerance of 10s"}},
		{name: "two of three dead 11 s, the witnesses' reports a second old: not yet past the tolerance by their word", scene: func() *scene {
			return newScene().witnesses("w-0", "w-1").withBMC(1).withBMC(2).deadFor(1, 11*time.Second).deadFor(2, 11*time.Second)
		}, held: map[string]Reason{"m1": ReasonMayResume, "m2": ReasonMayResume}, why: "reported only through", watched: []string{"m1", "m2"}},
		{name: "dead 40 s (due 9 s ago), the others' latest reports 10 s old: the hub knows its silence only through them", scene: func() *scene {
			return newScene().deadFor(2, 40*time.Second).reportedAgo(10*time.Second, 0, 1)
		}, held: map[string]Reason{"m2": ReasonMayResume},
			why: "Its reboot was due at 03:59:51.0Z, but a majority of the observers have reported only through 03:59:50.0Z"},
		{name: "dead 40 s (due 9 s ago), the others' latest reports 8 s old: begins", scene: func() *scene {
			return newScene().deadFor(2, 40*time.Second).reportedAgo(8*time.Second, 0, 1)
		}, starts: map[string]string{"m2": "past its stall tolerance of 30s"}},
		{name: "dead 40 s, one of the others' reports 10 s old, the other's now: a majority needs both", scene: func() *scene {
			return newScene().deadFor(2, 40*time.Second).reportedAgo(10*time.Second, 0)
		}, held: map[string]Reason{"m2": ReasonMayResume}, why: "reported only through 03:59:50.0Z"},
		{name: "dead 5 s, its BMC read the power Off since: proved", scene: func() *scene {
			return newScene().withBMC(2).deadFor(2, 5*time.Second).bmcRead(2, time.Second, BMCReadiness{Power: bmcval.PowerOff})
		}, starts: map[string]string{"m2": "its BMC proves a hang: it read the power Off at"}},
		{name: "dead 5 s, the BMC's Off read before it stopped answering: no proof", scene: func() *scene {
			return newScene().withBMC(2).deadFor(2, 5*time.Second).bmcRead(2, 10*time.Second, BMCReadiness{Power: bmcval.PowerOff})
		}, held: map[string]Reason{"m2": ReasonMayResume}, watched: []string{"m2"}},
		{name: "dead 5 s, a kernel panic logged as it stopped: proved", scene: func() *scene {
			return newScene().withBMC(2).deadFor(2, 5*time.Second).bmcRead(2, 0, BMCReadiness{Power: bmcval.PowerOn, Hangs: []bmcval.LogEntry{hang(4 * time.Second)}})
		}, starts: map[string]string{"m2": "its event log has OS critical stop at"}},
		{name: "a panic logged 3 s before its last sign of life (within the margin): proved", scene: func() *scene {
			return newScene().withBMC(2).deadFor(2, 5*time.Second).bmcRead(2, 0, BMCReadiness{Power: bmcval.PowerOn, Hangs: []bmcval.LogEntry{hang(8 * time.Second)}})
		}, starts: map[string]string{"m2": "its BMC proves a hang"}},
		{name: "an old panic in the log (an hour ago): no proof", scene: func() *scene {
			return newScene().withBMC(2).deadFor(2, 5*time.Second).bmcRead(2, 0, BMCReadiness{Power: bmcval.PowerOn, Hangs: []bmcval.LogEntry{hang(time.Hour)}})
		}, held: map[string]Reason{"m2": ReasonMayResume}, watched: []string{"m2"}},
		{name: "health turned Critical since it stopped answering: proved", scene: func() *scene {
			s := newScene().withBMC(2).deadFor(2, 5*time.Second).bmcRead(2, 0, BMCReadiness{Power: bmcval.PowerOn, Health: bmcval.HealthCritical})
			r := s.f.BMCs["m2"]
			r.HealthSince = s.f.Now.Add(-2 * time.Second)
			s.f.BMCs["m2"] = r
			return s
		}, starts: map[string]string{"m2": "it read the system's health Critical at"}},
		{name: "health Critical since before it stopped answering: no proof", scene: func() *scene {
			s := newScene().withBMC(2).deadFor(2, 5*time.Second).bmcRead(2, 0, BMCReadiness{Power: bmcval.PowerOn, Health: bmcval.HealthCritical})
			r := s.f.BMCs["m2"]
			r.HealthSince = s.f.Now.Add(-time.Hour)
			s.f.BMCs["m2"] = r
			return s
		}, held: map[string]Reason{"m2": ReasonMayResume}, watched: []string{"m2"}},
		{name: "a BMC that failed its last reading proves nothing", scene: func() *scene {
			s := newScene().withBMC(2).deadFor(2, 5*time.Second)
			s.f.BMCs = map[string]BMCReadiness{"m2": {Checked: s.f.Now, Power: bmcval.PowerOff, Problem: bmcval.ProblemUnreachable}}
			return s
		}, held: map[string]Reason{"m2": ReasonMayResume}, watched: []string{"m2"}},
		{name: "Suspect, its agent gone per a majority while the views of its member are older than quorum's return: its BMC is watched", scene: func() *scene {
			return newScene().withBMC(2).gone(2)
		}, watched: []string{"m2"}},
		{name: "Suspect and gone without a BMC: nothing to read", scene: func() *scene { return newScene().gone(2) }},
		{name: "Suspect, not gone (one observer alone lost it): not watched", scene: func() *scene {
			s := newScene().withBMC(2).gone(2)
			s.f.Assessments[2].Gone = false
			return s
		}},
		{name: "alive, its kubelet failing 20 s: systemd's restart first", scene: func() *scene { return newScene().failingFor(0, "kubelet", 20*time.Second) },
			held: map[string]Reason{"m0": ReasonRestartFirst}, why: "m0's agent reports: waiting for systemd's restart of the kubelet"},
		{name: "alive, its etcd failing 2 min: the kubelet's restart first", scene: func() *scene { return newScene().failingFor(1, "etcd", 2*time.Minute) },
			held: map[string]Reason{"m1": ReasonRestartFirst}, why: "m1's agent reports: waiting for the kubelet's restart of etcd: failing since"},
		{name: "alive, its API server failing 3 min: past the grace", scene: func() *scene { return newScene().failingFor(1, "apiserver", 3*time.Minute) },
			starts: map[string]string{"m1": "alive but failing for 3m0s, past its component grace of 3m0s"}},
		{name: "quorum lost, a live machine's etcd silent 31 s: its shorter grace has passed", scene: func() *scene {
			return quorumLostWith(31 * time.Second)
		}, starts: map[string]string{"m1": "past its component grace of 30s (its member is needed for etcd's quorum)"},
			held: map[string]Reason{"m2": ReasonMayResume}, watched: []string{"m2"}},
		{name: "quorum lost 1 s ago, a live machine's etcd failing 50 s: its 30 s count from the loss", scene: func() *scene {
			s := quorumLostWith(50 * time.Second)
			s.f.lostSince = s.f.Now.Add(-time.Second)
			return s
		}, held: map[string]Reason{"m1": ReasonRestartFirst, "m2": ReasonMayResume}, watched: []string{"m2"},
			why: "its member is needed for etcd's quorum since 03:59:59.0Z"},
		{name: "quorum lost 31 s ago, a live machine's etcd failing 50 s: past its shorter grace", scene: func() *scene {
			s := quorumLostWith(50 * time.Second)
			s.f.lostSince = s.f.Now.Add(-31 * time.Second)
			return s
		}, starts: map[string]string{"m1": "past its component grace of 30s (its member is needed for etcd's quorum since"},
			held: map[string]Reason{"m2": ReasonMayResume}, watched: []string{"m2"}},
		{name: "quorum lost 5 min ago, a live machine's etcd failing 3 min: its longer grace ends first", scene: func() *scene {
			s := quorumLostWith(3 * time.Minute)
			s.f.lostSince = s.f.Now.Add(-10 * time.Second)
			return s
		}, starts: map[string]string{"m1": "past its component grace of 3m0s (its member is needed for etcd's quorum)"},
			held: map[string]Reason{"m2": ReasonMayResume}, watched: []string{"m2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.scene().decide()
			starts := map[string]string{}
			for _, b := range d.begin {
				starts[b.Machine.Name] = b.Remediation.Reason
				assert.Equal(t, assessmentDead(d, b.Machine.Name), b.Remediation.WhileDead, "%s: begun while dead, withdrawn on a sign of life", b.Machine.Name)
			}
			require.Len(t, starts, len(tc.starts), "begun: %v; holds: %v", starts, d.holds)
			for m, grounds := range tc.starts {
				assert.Contains(t, starts[m], grounds, m)
			}
			for m, r := range tc.held {
				assert.Equal(t, r, d.holds[m].Reason, "%s: %s", m, d.holds[m].Why)
				assert.Contains(t, d.holds[m].Why, tc.why, m)
			}
			assert.Equal(t, tc.watched, d.watch, "the BMCs read for proof")
		})
	}
}

// quorumLostWith is a scene where etcd's quorum is lost: m2 dead 5 s, and m1 alive with its etcd
// failing for failing.
func quorumLostWith(failing time.Duration) *scene { return quorumLostAt(newScene().f.Now, failing) }

// quorumLostAt is quorumLostWith seen at now.
func quorumLostAt(now time.Time, failing time.Duration) *scene {
	s := newSceneAt(now).witnesses("w-0", "w-1").withBMC(2).deadFor(2, 5*time.Second)
	s.f.Assessments[1] = assess.Assessment{Machine: "m1", Verdict: assess.VerdictUnhealthy, EtcdHealth: quorum.Unhealthy, Failing: []string{"etcd"},
		Reasons: []string{"etcd failing"}, Since: s.f.Now.Add(-failing), Alive: true, LifeAt: s.f.Now}
	return s
}

// A loss of quorum the hub sees for a moment (a loaded pass in which a second member looked down)
// cuts no wait short: the pass that first sees it begins nothing on the shorter waits of a member
// needed for quorum, and the pass after, quorum back, decides nothing. Seen again soon after, it is a
// new loss, counted afresh (blips a few seconds apart are no lasting loss); seen for the shorter wait
// without a break, it acts (a loaded stall matrix power-cycled a member whose etcd alone hung, on a
// loss seen 0.6 s).
func TestAQuorumLossSeenForAMomentCutsNoWait(t *testing.T) {
	s := quorumLostWith(50 * time.Second)
	st, rd := Compute(NewState(), s.stepFacts())
	require.Empty(t, rd.Begin, "begun on a loss seen for one pass: %v", said(rd))
	require.True(t, st.View.quorumLost)
	assert.Equal(t, ReasonRestartFirst, st.View.Holds["m1"].Reason, st.View.Holds["m1"].Why)
	assert.Contains(t, st.View.Holds["m1"].Why, "needed for etcd's quorum since")

	back := newSceneAt(s.f.Now.Add(600*time.Millisecond)).witnesses("w-0", "w-1").withBMC(2)
	next, rd := Compute(st, back.stepFacts())
	require.Empty(t, rd.Begin)
	assert.False(t, next.View.quorumLost)

	t0 := s.f.Now
	again, rd := Compute(next, quorumLostAt(t0.Add(5*time.Second), 55*time.Second).stepFacts())
	require.Empty(t, rd.Begin, "a loss seen again 4.4 s after it was seen back: a new one")
	st, rd = Compute(again, quorumLostAt(t0.Add(34*time.Second), 84*time.Second).stepFacts())
	require.Empty(t, rd.Begin, "29 s into the new loss, 34 s after the first was seen: %v", said(rd))
	_, rd = Compute(st, quorumLostAt(t0.Add(35*time.Second), 85*time.Second).stepFacts())
	require.Len(t, rd.Begin, 1, "a loss that lasts the shorter wait without a break: %v", said(rd))
	assert.Contains(t, rd.Begin[0].Remediation.Reason, "past its component grace of 30s")
}

// assessmentDead: a machine of these scenes begun past its stall tolerance (not failing, not on its
// BMC's proof) is withdrawn on a sign of life.
func assessmentDead(d decision, m string) bool {
	for _, b := range d.begin {
		if b.Machine.Name == m {
			return strings.Contains(b.Remediation.Reason, "past its stall tolerance")
		}
	}
	return false
}

// Two machines that freeze and resume at random, some of their hangs proved by their BMCs, through
// one state pass after pass (every 500 ms), and now and then a starved stretch of up to 13 s in which
// no report reaches the hub (every process starved alike: what the observers tell it stays what it was
// when the stretch began): a remediation begins only on a machine the hub sees dead whose freeze, the
// one it sees, lasted its stall tolerance (10 s while the other is dead too and quorum is lost, 30 s
// otherwise) before it resumed, if it did, or on its BMC's proof of a hang since its last sign of
// life; and every hang that outlasts them, outside a stretch, is acted on within a pass of the
// observers' word. (Counted to the hub's now rather than to the observers' word, a stretch that hides
// a resume lets the tolerance run out on a machine that runs: seed 8 fails so.)
func TestStallRandomized(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 30
	}
	const tick = 500 * time.Millisecond
	type freeze struct{ from, to time.Time } // to: zero while it lasts
	type life struct {
		frozen, acted bool
		since         time.Time // when it froze or resumed
		until         time.Time // when that ends by itself
		proofAt       time.Time // when its BMC proves this freeze a hang (zero: never)
		freezes       []freeze
	}
	// freezeAt is l's freeze under way at k, if any.
	freezeAt := func(l *life, k time.Time) (freeze, bool) {
		for j := len(l.freezes) - 1; j >= 0; j-- {
			if f := l.freezes[j]; !k.Before(f.from) && (f.to.IsZero() || k.Before(f.to)) {
				return f, true
			}
		}
		return freeze{}, false
	}
	stretches := 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 58))
		machines := []*life{1: {}, 2: {}} // m1 and m2
		order := []int{1, 2}
		st := NewState()
		t0 := newScene().f.Now
		var starvedFrom, starvedTo time.Time // the latest stretch
		for n := range 400 {
			now := t0.Add(time.Duration(n) * tick)
			if !now.Before(starvedTo) && rng.IntN(40) == 0 {
				starvedFrom, starvedTo = now, now.Add(time.Duration(1000+rng.IntN(12000))*time.Millisecond)
				stretches++
			}
			starved := now.Before(starvedTo)
			known := now // what the observers' reports tell of: now, or when the stretch began
			if starved {
				known = starvedFrom
			}
			for _, i := range order {
				l := machines[i]
				if !now.Before(l.until) { // the freeze or the run ends by itself
					l.frozen, l.acted, l.since, l.proofAt = !l.frozen, false, now, time.Time{}
					if l.frozen {
						l.freezes = append(l.freezes, freeze{from: now})
						l.until = now.Add(time.Duration(500+rng.IntN(45000)) * time.Millisecond)
						if rng.IntN(4) == 0 { // read after its last sign of life (the gossip holds it alive a second)
							l.proofAt = now.Add(time.Second + time.Duration(rng.IntN(int(l.until.Sub(now)/time.Millisecond)))*time.Millisecond)
						}
					} else {
						l.freezes[len(l.freezes)-1].to = now
						l.until = now.Add(time.Duration(1000+rng.IntN(20000)) * time.Millisecond)
					}
				}
			}
			s := newSceneAt(now).witnesses("w-0", "w-1").withBMC(1).withBMC(2)
			s.f.Inventory.Policy.RateMax, s.f.Inventory.Policy.Cooldown = 1000, 0
			both := true
			seen := map[int]freeze{} // the freeze the hub sees of each machine it sees dead
			for _, i := range order {
				l := machines[i]
				// Dead to the observers a second after it froze, as the gossip's detection takes.
				f, frozen := freezeAt(l, known)
				if !frozen || l.acted || known.Sub(f.from) < time.Second {
					both = false
					s.f.Assessments[i].LifeAt = known
					continue
				}
				seen[i] = f
				s.dead(i)
				s.f.Assessments[i].Since, s.f.Assessments[i].LifeAt = f.from.Add(time.Second), f.from
				if l.frozen && !l.proofAt.IsZero() && !now.Before(l.proofAt) {
					s.bmcRead(i, now.Sub(l.proofAt), BMCReadiness{Power: bmcval.PowerOff})
				}
			}
			for node, r := range s.w.Obs.Reports { // sent when what they tell was so (a witness's a second later)
				r.SentAt = r.SentAt.Add(known.Sub(now))
				s.w.Obs.Reports[node] = r
			}
			var rd Ready
			st, rd = Compute(st, s.stepFacts())
			where := fmt.Sprintf("seed %d at %v", seed, now.Sub(t0))
			for _, b := range rd.Begin {
				i := map[string]int{"m1": 1, "m2": 2}[b.Machine.Name]
				l, f := machines[i], seen[i]
				require.False(t, f.from.IsZero(), "%s: %s begun, not seen dead: %s", where, b.Machine.Name, b.Remediation.Reason)
				tol := s.f.Inventory.Policy.StallTolerance.For(both)
				proved := l.frozen && !l.proofAt.IsZero() && !now.Before(l.proofAt)
				lasted := now.Sub(f.from)
				if !f.to.IsZero() {
					lasted = f.to.Sub(f.from)
				}
				require.True(t, lasted >= tol || proved, "%s: %s begun on a freeze of %v (resumed: %v; tolerance %v, no proof): %s",
					where, b.Machine.Name, lasted, !f.to.IsZero(), tol, b.Remediation.Reason)
				l.acted = true // power-cycled: back in 5 s
				if !l.frozen {
					l.frozen, l.since = true, now
					l.freezes = append(l.freezes, freeze{from: now})
				}
				l.until = now.Add(5 * time.Second)
			}
			for _, i := range order {
				l := machines[i]
				if st.View.NotPlanning != "" || !rd.QuorumBack.IsZero() || starved {
					break // decided nothing (quorum's return), or the observers' word is late: the next pass decides
				}
				if !l.since.After(starvedTo) {
					continue // the freeze began before the latest stretch ended: the hub saw it late
				}
				tol := s.f.Inventory.Policy.StallTolerance.Held
				if both {
					tol = s.f.Inventory.Policy.StallTolerance.Needed
				}
				proved := !l.proofAt.IsZero() && now.Sub(l.proofAt) >= tick
				// Declared dead a second after it froze: the tolerance counts from then, and it ends once
				// the observers' reports (the witnesses', a second old) pass it.
				if l.frozen && !l.acted && (now.Sub(l.since) >= tol+2*time.Second+tick && !both || proved) {
					t.Fatalf("%s: m%d frozen for %v (tolerance %v, proved %v at %v) and not acted on: %v; BMC %+v; said %v; not planning %q", where, i, now.Sub(l.since), tol, proved, l.proofAt.Sub(t0), st.View.Holds, s.f.BMCs, said(rd), st.View.NotPlanning)
				}
			}
		}
	}
	t.Logf("%d seeds, %d starved stretches", seeds, stretches)
}

// Each Unhealthy stretch is an episode: one that ends with nothing done is said (Resumed) and comes
// out resumed, from its last sign of life; one during which a remediation was in flight, acted; one
// the hub began on its BMC's proof, proved; a stretch that turns from dead to failing is two.
func TestEpisodes(t *testing.T) {
	t0 := newScene().f.Now
	at := func(d time.Duration, edit func(*scene)) Facts {
		s := newSceneAt(t0.Add(d)).withBMC(2)
		edit(s)
		return s.stepFacts()
	}
	dead := func(since time.Duration) func(*scene) {
		return func(s *scene) {
			s.dead(2)
			s.f.Assessments[2].Since, s.f.Assessments[2].LifeAt = t0.Add(since+time.Second), t0.Add(since)
		}
	}
	healthy := func(*scene) {}
	run := func(passes ...Facts) (State, []Episode, [][]string) {
		st := NewState()
		var eps []Episode
		var says [][]string
		for _, f := range passes {
			var rd Ready
			st, rd = Compute(st, f)
			eps = append(eps, rd.Episodes...)
			says = append(says, said(rd))
		}
		return st, eps, says
	}

	_, eps, says := run(at(0, healthy), at(2*time.Second, dead(0)), at(4*time.Second, dead(0)), at(5*time.Second, healthy))
	require.Len(t, eps, 1)
	e := eps[0]
	assert.Equal(t, Episode{Machine: "m2", Kind: EpisodeDead, Began: t0, Ended: t0.Add(5 * time.Second), Outcome: EpisodeResumed, Why: e.Why}, e)
	assert.Equal(t, 5*time.Second, e.Length())
	assert.Equal(t, []string{"Healthy m2", "Resumed m2"}, says[3])
	assert.Contains(t, e.String(), "dead resumed for 5s (04:00:00.0Z to 04:00:05.0Z)")

	reboot := quorum.Plan{Strategy: quorum.Reboot, Steps: quorum.MustParseSteps("power-cycle etcd-2", "await-healthy etcd-2")}
	inFlight := func(s *scene) {
		dead(0)(s)
		s.f.Flights["m2"] = Flight{Plan: reboot}
	}
	_, eps, says = run(at(0, healthy), at(40*time.Second, dead(0)), at(41*time.Second, inFlight), at(60*time.Second, healthy))
	require.Len(t, eps, 1)
	assert.Equal(t, EpisodeActed, eps[0].Outcome)
	assert.Contains(t, eps[0].Grounds, "past its stall tolerance of 30s")
	assert.NotContains(t, says[3], "Resumed m2")

	proved := func(s *scene) { dead(0)(s); s.bmcRead(2, 0, BMCReadiness{Power: bmcval.PowerOff}) }
	_, eps, _ = run(at(0, healthy), at(3*time.Second, proved), at(4*time.Second, inFlight), at(60*time.Second, healthy))
	require.Len(t, eps, 1)
	assert.Equal(t, EpisodeProved, eps[0].Outcome)
	assert.Contains(t, eps[0].Grounds, "its BMC proves a hang: it read the power Off")

	// Power-cycled on the proof, it comes into view and goes again as it reboots: that episode, begun
	// and ended while the remediation runs, came back by nothing but the remediation.
	rebooting := func(since time.Duration) func(*scene) {
		return func(s *scene) { dead(since)(s); inFlight(s); s.f.Assessments[2].LifeAt = t0.Add(since) }
	}
	back := func(s *scene) {
		s.f.Flights["m2"] = Flight{Plan: reboot, Next: 1}
	}
	seen := func(s *scene) { // its agent back for a moment: a sign of life
		inFlight(s)
		s.f.Assessments[2] = assess.Assessment{Machine: "m2", Verdict: assess.VerdictSuspect, LifeAt: t0.Add(5 * time.Second)}
	}
	_, eps, says = run(at(0, healthy), at(3*time.Second, proved), at(4*time.Second, inFlight), at(5*time.Second, seen),
		at(6*time.Second, rebooting(5*time.Second)), at(7*time.Second, back))
	require.Len(t, eps, 2)
	assert.Equal(t, []EpisodeOutcome{EpisodeProved, EpisodeActed}, []EpisodeOutcome{eps[0].Outcome, eps[1].Outcome})
	for _, s := range says {
		assert.NotContains(t, s, "Resumed m2", "nothing came back by itself")
	}

	failing := func(s *scene) { s.failingFor(2, "etcd", 3*time.Second) }
	_, eps, _ = run(at(0, healthy), at(2*time.Second, dead(0)), at(6*time.Second, failing), at(20*time.Second, healthy))
	require.Len(t, eps, 2)
	assert.Equal(t, []string{EpisodeDead, EpisodeFailing}, []string{eps[0].Kind, eps[1].Kind})
	assert.Equal(t, []EpisodeOutcome{EpisodeResumed, EpisodeResumed}, []EpisodeOutcome{eps[0].Outcome, eps[1].Outcome})
	assert.Equal(t, t0.Add(3*time.Second), eps[1].Began, "failing since its probe began to")

	_, eps, _ = run(at(0, healthy), at(2*time.Second, func(s *scene) { dead(0)(s); s.f.Listen = "standing by" }), at(5*time.Second, func(s *scene) { s.f.Listen = "standing by" }))
	assert.Empty(t, eps, "a hub that stands by journals no episode")
}
