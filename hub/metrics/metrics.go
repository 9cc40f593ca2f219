// Package metrics is the hub's Prometheus metrics: the counters of what happens (Counters), and the
// gauges read from the operator's status at scrape time (Collector), so that there is no second
// bookkeeping.
package metrics

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
)

// Counters holds what must be counted as it happens; everything else is read from operator.Status at
// scrape time (Collector). A nil *Counters records nothing.
type Counters struct {
	remediations *prometheus.CounterVec
	toAction     prometheus.Histogram
	notices      *prometheus.CounterVec
	episodes     *prometheus.CounterVec
	episodeLen   *prometheus.HistogramVec
}

// New registers the hub's metrics with reg (nil: none):
//
//	hale_hub_machines{verdict}                             machines by verdict
//	hale_hub_machines_needing_operator{reason}             Unhealthy machines the hub will not heal again by itself (GaveUp, Flapping, Fenced, Unseen, Retired)
//	hale_hub_etcd_voters, _healthy_voters, _quorum         the membership the hub plans with
//	hale_hub_etcd_fault_tolerance, hale_hub_budget         healthy voters beyond quorum; what Hale may disrupt now
//	hale_hub_etcd_quorum_lost_for_good                     1 while quorum is lost and no lost voter will come back by itself
//	hale_hub_planning                                      1 when the latest pass planned, 0 when it waited
//	hale_hub_remediations_in_flight                        remediations under way
//	hale_hub_paused{state}, hale_hub_suspended             the operator's brakes (state: operator.Running, operator.Pausing, operator.Paused)
//	hale_hub_detached_machines                             machines detached by the operator
//	hale_hub_bmc_ready{machine}                            1 when the last readiness check of its BMC passed, 0 when not
//	hale_hub_out_of_service{machine}                       1 while its Node carries the out-of-service taint Hale put on
//	hale_hub_remediations_total{strategy,requested_by,result}  finished remediations (succeeded, failed)
//	hale_hub_detection_to_action_seconds                   from Unhealthy to the first BMC call of the hub's own remediations
//	hale_hub_notices_total{reason,type}                    what the hub said (type: Normal, Warning), as its Events
//	hale_hub_episodes_total{kind,outcome}                  Unhealthy episodes that ended (kind: dead, failing; outcome: resumed, acted, proved)
//	hale_hub_episode_seconds{kind,outcome}                 their lengths (from the last sign of life, or the component's failure)
//	hale_hub_stall_tolerance_seconds{quorum}               the stall tolerance in force (quorum: held, needed)
//	hale_hub_component_grace_seconds{quorum}               the component grace in force
func New(reg prometheus.Registerer) (*Counters, error) {
	if reg == nil {
		return nil, nil
	}
	m := &Counters{
		remediations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hale_hub_remediations_total",
			Help: "Finished remediations by strategy, who asked (hub or an operator) and result.",
		}, []string{"strategy", "requested_by", "result"}),
		toAction: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hale_hub_detection_to_action_seconds",
			Help:    "Time from a machine's verdict turning Unhealthy to the first BMC call of its remediation.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		notices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hale_hub_notices_total",
			Help: "What the hub said (its log lines, timeline and Kubernetes Events) by reason and type (Normal, Warning).",
		}, []string{"reason", "type"}),
		episodes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hale_hub_episodes_total",
			Help: "Episodes that ended: stretches of time a machine was Unhealthy, by kind (dead: to a majority of the observers; failing: a component, its agent reporting) " +
				"and outcome (resumed: back by itself, nothing done; acted: a remediation began, past the stall tolerance or component grace, or an operator's; " +
				"proved: begun on its BMC's proof of a hang).",
		}, []string{"kind", "outcome"}),
		episodeLen: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "hale_hub_episode_seconds",
			Help: "Length of the episodes that ended, from the machine's last sign of life (dead) or the component's failure (failing) to its end: " +
				"how close the pauses that resumed by themselves come to the stall tolerance.",
			Buckets: []float64{.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 25, 30, 45, 60, 90, 120, 180, 300, 600},
		}, []string{"kind", "outcome"}),
	}
	for _, kind := range []string{pass.EpisodeDead, pass.EpisodeFailing} { // every series from the start: an alert's rate over it needs one
		for _, o := range pass.Outcomes() {
			m.episodes.WithLabelValues(kind, string(o))
			m.episodeLen.WithLabelValues(kind, string(o))
		}
	}
	for _, c := range []prometheus.Collector{m.remediations, m.toAction, m.notices, m.episodes, m.episodeLen} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Notice counts it.
func (m *Counters) Notice(n pass.Notice) {
	if m != nil {
		typ := "Normal"
		if n.Warning {
			typ = "Warning"
		}
		m.notices.WithLabelValues(string(n.Reason), typ).Inc()
	}
}

// Remediation counts it.
func (m *Counters) Remediation(rem journal.Remediation, result string) {
	if m != nil {
		requestedBy := "operator"
		if rem.RequestedBy == "hub" {
			requestedBy = "hub"
		}
		m.remediations.WithLabelValues(rem.Strategy, requestedBy, result).Inc()
	}
}

// Episode counts it.
func (m *Counters) Episode(e pass.Episode) {
	if m != nil {
		m.episodes.WithLabelValues(e.Kind, string(e.Outcome)).Inc()
		m.episodeLen.WithLabelValues(e.Kind, string(e.Outcome)).Observe(e.Length().Seconds())
	}
}

// DetectionToAction counts it.
func (m *Counters) DetectionToAction(d time.Duration) {
	if m != nil {
		m.toAction.Observe(d.Seconds())
	}
}

// Collector reads the hub's operator.Status at scrape time.
type Collector struct {
	status                                                  func(context.Context) operator.Status
	machines, voters, healthy, quorum, tolerance, available *prometheus.Desc
	planning, inFlight, paused, suspended, detached         *prometheus.Desc
	observersExpected, observersHeard, loginWaits           *prometheus.Desc
	needOperator, degraded, machineVerdict, machineStep     *prometheus.Desc
	bmcReady, lostForGood, outOfService                     *prometheus.Desc
	stallTolerance, componentGrace                          *prometheus.Desc
}

// NewCollector returns a collector of the status that status gives.
func NewCollector(status func(context.Context) operator.Status) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &Collector{status: status,
		machines: d("hale_hub_machines", "Machines by verdict.", "verdict"),
		needOperator: d("hale_hub_machines_needing_operator", "Unhealthy machines the hub will not heal again by itself, by reason "+
			"(GaveUp: maxAttempts failed; Flapping: maxAttempts within the flap window; Fenced: kept off on purpose; "+
			"Unseen: power-cycled and seen by nobody since, a partition or a host that does not boot; "+
			"Retired: a member of the old etcd cluster a recovery replaced, until `agent rejoin` on it).", "reason"),
		voters:            d("hale_hub_etcd_voters", "Voting etcd members in the membership the hub plans with."),
		healthy:           d("hale_hub_etcd_healthy_voters", "Healthy, undisrupted voters."),
		quorum:            d("hale_hub_etcd_quorum", "Voters etcd needs for quorum."),
		tolerance:         d("hale_hub_etcd_fault_tolerance", "Healthy voters beyond quorum (negative: quorum lost)."),
		available:         d("hale_hub_budget", "Healthy voters Hale may disrupt now (fault tolerance minus minFaultTolerance)."),
		planning:          d("hale_hub_planning", "1 when the latest pass planned, 0 when it waited (see hub status)."),
		inFlight:          d("hale_hub_remediations_in_flight", "Remediations under way."),
		paused:            d("hale_hub_paused", "1 for the hub's pause state.", "state"),
		suspended:         d("hale_hub_suspended", "1 while the hub is observe-only."),
		detached:          d("hale_hub_detached_machines", "Machines detached by the operator."),
		observersExpected: d("hale_hub_observers_expected", "Observers whose strict majority every action needs: the agents, the witnesses and the hub."),
		observersHeard:    d("hale_hub_observers_heard", "Expected observers the hub hears now (itself included); below a strict majority of the expected, it acts on nothing."),
		machineVerdict:    d("hale_hub_machine_verdict", "1 for each machine's current verdict (Healthy, Suspect, Unhealthy, Unknown), 0 for the others.", "machine", "verdict"),
		machineStep:       d("hale_hub_machine_remediation_step", "For each machine with a remediation in flight, the index of the step under way (0-based; the step's text is in hub status).", "machine", "strategy", "steps"),
		degraded:          d("hale_hub_degraded", "1 while this hub acts without the API server (Kubernetes mode's degraded mode: etcd quorum lost; see hub status)."),
		bmcReady: d("hale_hub_bmc_ready", "For each machine whose BMC was checked, 1 when its last readiness check passed (it answered, took the login, "+
			"has the system, read the power), 0 when not (hub status and explain say why; `hub check` checks again).", "machine"),
		lostForGood: d("hale_hub_etcd_quorum_lost_for_good", "1 while etcd's quorum is lost, the voters not lost are too few for a quorum, and every lost voter has evidence that it will not "+
			"come back (its BMC unreachable or without the system, its power Off, maxAttempts power-cycles that did not bring it back), 0 otherwise: "+
			"only a recovery from a survivor brings the cluster back (hub status says which voters, and why)."),
		outOfService: d("hale_hub_out_of_service", "For each machine whose Node carries the out-of-service taint Hale put on (a fenced machine its BMC reads Off: "+
			"its pods are deleted and their volumes detached, to start elsewhere), 1 (hub explain says since when and why).", "machine"),
		stallTolerance: d("hale_hub_stall_tolerance_seconds", "The stall tolerance in force: how long a machine dead to a majority of the observers "+
			"must show no sign of life before it is power-cycled, fenced or replaced (quorum: held, while etcd keeps quorum without it; needed, when its member is needed).", "quorum"),
		componentGrace: d("hale_hub_component_grace_seconds", "The component grace in force: how long a machine whose agent reports, a component failing, "+
			"is left to the kubelet's or systemd's restart of it (quorum: held, needed).", "quorum"),
		loginWaits: d("hale_hub_bmc_login_waits", "Machines whose BMC account refused the credentials: the hub makes no login to it until its backoff ends or the credentials change (hub status says until when)."),
	}
}

// Describe sends every descriptor.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.machines, c.needOperator, c.voters, c.healthy, c.quorum, c.tolerance, c.available, c.planning,
		c.inFlight, c.paused, c.suspended, c.detached, c.observersExpected, c.observersHeard, c.loginWaits, c.degraded, c.machineVerdict, c.machineStep, c.bmcReady, c.lostForGood, c.outOfService,
		c.stallTolerance, c.componentGrace} {
		ch <- d
	}
}

// Collect sends the gauges of the status now.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.CollectStatus(c.status(context.Background()), ch)
}

// CollectStatus sends the gauges that st gives.
func (c *Collector) CollectStatus(st operator.Status, ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	verdicts := map[assess.Verdict]float64{assess.VerdictHealthy: 0, assess.VerdictSuspect: 0, assess.VerdictUnhealthy: 0, "Unknown": 0}
	inFlight, detached, loginWaits := 0.0, 0.0, 0.0
	needs := map[pass.OperatorNeed]float64{pass.NeedGaveUp: 0, pass.NeedFlapping: 0, pass.NeedFenced: 0, pass.NeedUnseen: 0, pass.NeedRetired: 0}
	for _, m := range st.Machines {
		for _, v := range []assess.Verdict{assess.VerdictHealthy, assess.VerdictSuspect, assess.VerdictUnhealthy, "Unknown"} {
			gauge(c.machineVerdict, boolGauge(m.Verdict == v), m.Name, string(v))
		}
		if m.BMC != nil {
			gauge(c.bmcReady, boolGauge(m.BMC.Ready), m.Name)
		}
		if m.OutOfService != "" {
			gauge(c.outOfService, 1, m.Name)
		}
		if r := m.Remediation; r != nil {
			gauge(c.machineStep, float64(r.Step), m.Name, r.Strategy, strconv.Itoa(len(r.Steps)))
		}
		verdicts[m.Verdict]++
		if m.NeedsOperator != "" {
			needs[m.NeedsOperator]++
		}
		if m.BMCLogin != "" {
			loginWaits++
		}
		if m.Remediation != nil {
			inFlight++
		}
		if m.Detached {
			detached++
		}
	}
	for v, n := range verdicts {
		gauge(c.machines, n, string(v))
	}
	for r, n := range needs {
		gauge(c.needOperator, n, string(r))
	}
	if b := st.Budget; b != nil {
		gauge(c.voters, float64(b.Voters))
		gauge(c.healthy, float64(b.HealthyVoters))
		gauge(c.quorum, float64(b.Quorum))
		gauge(c.tolerance, float64(b.FaultTolerance))
		gauge(c.available, float64(b.Available))
	}
	gauge(c.planning, boolGauge(st.NotPlanning == ""))
	gauge(c.inFlight, inFlight)
	for _, s := range []operator.PauseState{operator.Running, operator.Pausing, operator.Paused} {
		gauge(c.paused, boolGauge(st.Pause == s), string(s))
	}
	gauge(c.suspended, boolGauge(st.Suspended))
	gauge(c.detached, detached)
	gauge(c.observersExpected, float64(st.Observers.Expected))
	gauge(c.observersHeard, float64(len(st.Observers.Heard)))
	gauge(c.loginWaits, loginWaits)
	gauge(c.degraded, boolGauge(st.Degraded != ""))
	gauge(c.lostForGood, boolGauge(st.QuorumLoss != nil && st.QuorumLoss.ForGood))
	gauge(c.stallTolerance, st.Policy.StallTolerance.QuorumHeld.Seconds(), "held")
	gauge(c.stallTolerance, st.Policy.StallTolerance.QuorumNeeded.Seconds(), "needed")
	gauge(c.componentGrace, st.Policy.ComponentGrace.QuorumHeld.Seconds(), "held")
	gauge(c.componentGrace, st.Policy.ComponentGrace.QuorumNeeded.Seconds(), "needed")
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
