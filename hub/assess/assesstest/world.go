// Package assesstest builds the observations the assessor and the hub's pass are tested on: a world
// of three control-plane machines (every node alive and reporting, every probe passing, every member
// reachable from everyone) that each case edits.
package assesstest

import (
	"time"

	"github.com/hale-dev/hale/health/report"
	"github.com/hale-dev/hale/hub/assess"
)

// T0 is when the world began: every node alive, every probe passing since.
func T0() time.Time { return time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC) }

// Machines are the world's three control-plane machines, each with an etcd member.
func Machines() []assess.MachineRef {
	return []assess.MachineRef{
		{Name: "m0", Node: "cp-0", Member: "etcd-0"},
		{Name: "m1", Node: "cp-1", Member: "etcd-1"},
		{Name: "m2", Node: "cp-2", Member: "etcd-2"},
	}
}

// World builds observations: every node alive and reporting fresh, every probe passing, every member
// reachable from everyone; edit lets a case change it.
type World struct {
	Obs       assess.Observations
	Witnesses []string
}

// NewWorld is the world as seen at now.
func NewWorld(now time.Time) *World {
	w := &World{Obs: assess.Observations{Now: now, Reports: map[string]report.Report{}, HubPeers: map[string]report.PeerView{}}}
	for _, m := range Machines() {
		w.Obs.HubPeers[m.Node] = report.PeerView{Name: m.Node, State: report.PeerAlive, Since: T0()}
		r := report.Report{Node: m.Node, SentAt: now, Etcd: &report.EtcdView{LocalName: m.Member},
			Probes: []report.ProbeResult{{Name: "kubelet", OK: true, Since: T0()}, {Name: "etcd", OK: true, Since: T0()}}}
		for _, o := range Machines() {
			yes := true
			r.Etcd.Members = append(r.Etcd.Members, report.EtcdMember{Name: o.Member, Reachable: &yes})
			if o.Node != m.Node {
				r.Peers = append(r.Peers, report.PeerView{Name: o.Node, State: report.PeerAlive, Since: T0()})
			}
		}
		w.Obs.Reports[m.Node] = r
	}
	return w
}

// Witness adds witness agents (no etcd member), alive and reporting, seeing every node alive.
func (w *World) Witness(nodes ...string) *World {
	for _, n := range nodes {
		w.Witnesses = append(w.Witnesses, n)
		w.Obs.HubPeers[n] = report.PeerView{Name: n, State: report.PeerAlive, Since: T0()}
		r := report.Report{Node: n, SentAt: w.Obs.Now.Add(-time.Second)}
		for _, m := range Machines() {
			r.Peers = append(r.Peers, report.PeerView{Name: m.Node, State: report.PeerAlive, Since: T0()})
		}
		w.Obs.Reports[n] = r
	}
	return w
}

// Cut makes the hub lose nodes: dead in its view, their last reports stale.
func (w *World) Cut(since time.Time, nodes ...string) *World {
	for _, n := range nodes {
		w.Obs.HubPeers[n] = report.PeerView{Name: n, State: report.PeerDead, Since: since}
		r := w.Obs.Reports[n]
		r.SentAt = w.Obs.Now.Add(-time.Minute)
		w.Obs.Reports[n] = r
	}
	return w
}

// Dead marks node's machine dead since since in the hub's view and in the listed observers' reports:
// its agent gone from gossip and its etcd member unreachable.
func (w *World) Dead(node string, since time.Time, by ...string) *World {
	for _, m := range Machines() {
		if m.Node == node {
			w.Unreachable(m.Member, by...)
		}
	}
	return w.AgentDead(node, since, by...)
}

// AgentDead marks only node's agent dead (crashed, stopped): gone from gossip, while its machine's
// etcd member still answers.
func (w *World) AgentDead(node string, since time.Time, by ...string) *World {
	w.Obs.HubPeers[node] = report.PeerView{Name: node, State: report.PeerDead, Since: since}
	for _, o := range by {
		r := w.Obs.Reports[o]
		for i := range r.Peers {
			if r.Peers[i].Name == node {
				r.Peers[i] = report.PeerView{Name: node, State: report.PeerDead, Since: since}
			}
		}
		w.Obs.Reports[o] = r
	}
	return w
}

// Unreachable marks member unreachable in the listed observers' etcd views.
func (w *World) Unreachable(member string, by ...string) *World {
	for _, o := range by {
		r := w.Obs.Reports[o]
		for i := 0; r.Etcd != nil && i < len(r.Etcd.Members); i++ {
			if r.Etcd.Members[i].Name == member {
				no := false
				r.Etcd.Members[i].Reachable = &no
			}
		}
		w.Obs.Reports[o] = r
	}
	return w
}

// Probe sets node's probe name to ok (failing: "connection refused") since since.
func (w *World) Probe(node, name string, ok bool, since time.Time) *World {
	r := w.Obs.Reports[node]
	r.Probes = append([]report.ProbeResult(nil), r.Probes...)
	for i := range r.Probes {
		if r.Probes[i].Name == name {
			r.Probes[i] = report.ProbeResult{Name: name, OK: ok, Since: since, Detail: "connection refused"}
		}
	}
	w.Obs.Reports[node] = r
	return w
}

// Hearing is an assessor of a hub that has heard a majority of its observers since long ago.
func Hearing(p assess.Policy) *assess.Assessor {
	a := assess.NewAssessor(p)
	a.HeardFrom(T0(), "the test's hub has heard its observers since T0()")
	return a
}

func ByName(as []assess.Assessment) map[string]assess.Assessment {
	out := map[string]assess.Assessment{}
	for _, a := range as {
		out[a.Machine] = a
	}
	return out
}

// Versioned sets every report's version (the agents' reports grow theirs with each one they send).
func (w *World) Versioned(v uint64) *World {
	for n, r := range w.Obs.Reports {
		r.Version = v
		w.Obs.Reports[n] = r
	}
	return w
}

// Answering sets what node's own agent says of its member's status: it answers (as member id of
// cluster), or not (id "").
func (w *World) Answering(node, id, cluster string) *World {
	r := w.Obs.Reports[node]
	e := *r.Etcd
	e.LocalID, e.ClusterID = id, cluster
	r.Etcd = &e
	w.Obs.Reports[node] = r
	return w
}

// Version sets node's report version.
func (w *World) Version(node string, v uint64) *World {
	r := w.Obs.Reports[node]
	r.Version = v
	w.Obs.Reports[node] = r
	return w
}
