// Package report holds what an agent tells the hub, as values: its Report (probes, its etcd member's
// view, its peers' liveness). It imports nothing of Hale's and no I/O, so that the hub's pure packages
// (the assessor, the pass) read reports without importing the gossip that carries them (package
// health, whose names for these types are aliases of these).
package report

import "time"

// ProbeResult is one probe's latest outcome.
type ProbeResult struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
	// Since is when the probe entered its current state (OK or failing), so the hub can apply timeouts.
	Since     time.Time `json:"since"`
	CheckedAt time.Time `json:"checkedAt"`
}

// EtcdMember is one member of the etcd membership as the local member reports it.
type EtcdMember struct {
	ID         string   `json:"id"` // hex, as etcdctl prints it
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs,omitempty"`
	ClientURLs []string `json:"clientURLs,omitempty"`
	Learner    bool     `json:"learner,omitempty"`
	// Reachable says whether this agent could reach the member's client URL (nil: not checked).
	Reachable *bool `json:"reachable,omitempty"`
}

// EtcdView is the etcd membership and raft state as seen from this node's local member.
type EtcdView struct {
	// ClusterID is the etcd cluster's ID (hex) as the local member answers it: a cluster rebuilt from a
	// snapshot has a new one, and its raft indexes start again.
	ClusterID string       `json:"clusterID,omitempty"`
	LocalID   string       `json:"localID,omitempty"`
	LocalName string       `json:"localName,omitempty"`
	Members   []EtcdMember `json:"members,omitempty"`
	// LeaderID is the leader the local member follows now (raft's own state: set by the leader's
	// messages at the current term).
	LeaderID string `json:"leaderID,omitempty"`
	// RaftTerm is the term of the last entry the local member applied (etcd's Status reports that, not
	// raft's current term): a member that follows a new leader but has not applied its entries yet
	// reports the old term. RaftIndex is its commit index.
	RaftTerm  uint64   `json:"raftTerm,omitempty"`
	RaftIndex uint64   `json:"raftIndex,omitempty"`
	Alarms    []string `json:"alarms,omitempty"`
	// Error says why the view is incomplete (the local member did not answer, …).
	Error      string    `json:"error,omitempty"`
	ObservedAt time.Time `json:"observedAt"`
}

// PeerState is how this agent's memberlist sees a peer.
type PeerState string

// Peer states.
const (
	PeerAlive PeerState = "alive"
	PeerDead  PeerState = "dead"
	PeerLeft  PeerState = "left"
)

// PeerView is one peer's liveness as seen from here.
type PeerView struct {
	Name  string    `json:"name"`
	State PeerState `json:"state"`
	Since time.Time `json:"since"`
}

// Report is one agent's view at one time. Version grows with every report a node sends (even across
// restarts: it is taken from the clock), so a receiver keeps the newest.
type Report struct {
	Node    string    `json:"node"`
	Cluster string    `json:"cluster"`
	Version uint64    `json:"version"`
	SentAt  time.Time `json:"sentAt"`
	// Started is when this member joined the pool (its clock): a new value means the agent restarted,
	// which is how the hub knows a rebooted machine really came back.
	Started time.Time `json:"started,omitzero"`
	// Addr is the sender's gossip address (host:port), so that a member that never met it (a hub
	// restarted during a partition) can join it again.
	Addr   string        `json:"addr,omitempty"`
	Probes []ProbeResult `json:"probes,omitempty"`
	Etcd   *EtcdView     `json:"etcd,omitempty"`
	Peers  []PeerView    `json:"peers,omitempty"`
	// Leaving marks a member's last report before it leaves the pool on purpose.
	Leaving bool `json:"leaving,omitempty"`
	// KubeadmUpgrade, when set, is since when a kubeadm upgrade has been replacing this node's static
	// pod manifests (Agent.WatchKubeadm): planned work, during which the hub starts nothing on it.
	KubeadmUpgrade time.Time `json:"kubeadmUpgrade,omitzero"`
}

// JudgedTimeouts are the hub's defaults of how long each judged probe must fail before its machine is
// Unhealthy (the probes not listed are reported, not judged). health's probe registry registers each
// probe with its value here.
func JudgedTimeouts() map[string]time.Duration {
	return map[string]time.Duration{"apiserver": 10 * time.Second, "etcd": 10 * time.Second, "kubelet": 10 * time.Second}
}
