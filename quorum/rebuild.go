package quorum

import "time"

// Rebuild is how etcd is rebuilt from its most advanced survivor after a permanent loss of quorum:
// the part of the hub's recovery plan (`hub recover`, hub.RecoveryPlan) that the node carrying it out
// reads (`agent recover` and `agent rejoin`, recovery.Plan). One definition for both: the JSON the
// hub writes is the JSON the node reads.
type Rebuild struct {
	Time time.Time `json:"time"`
	// Survivor is the member to rebuild from: the one with the highest raft index among the members
	// that answer now.
	Survivor *Survivor `json:"survivor,omitempty"`
	// BumpRevision is what etcdutl's --bump-revision gets.
	BumpRevision uint64 `json:"bumpRevision"`
	// Fence are the lost members to power off, and how, before anything else.
	Fence []FenceStep `json:"fence,omitempty"`
	// Blockers say why the plan cannot be carried out as it stands, and what to do.
	Blockers []string `json:"blockers,omitempty"`
	// Token is the new cluster's --initial-cluster-token, given when `hub recover --yes` begins the
	// recovery (empty: a plan only).
	Token string `json:"token,omitempty"`
}

// Survivor is a member that answers, as its agent last reported it.
type Survivor struct {
	Member    string    `json:"member"`
	Machine   string    `json:"machine,omitempty"`
	ClusterID string    `json:"clusterID"`
	Term      uint64    `json:"term"`
	Index     uint64    `json:"index"`
	Observed  time.Time `json:"observed"`
}

// FenceStep is one lost member to power off before the cluster is rebuilt.
type FenceStep struct {
	Machine string `json:"machine"`
	Member  string `json:"member"`
	// How: through its BMC, read back Off; or, where the BMC cannot be reached (ByHand), by the
	// operator, who confirms by name that it is off.
	How    string `json:"how"`
	ByHand bool   `json:"byHand,omitempty"`
	// Fenced: `hub recover --yes` read its power back Off, or the operator confirmed it by name (How
	// says which).
	Fenced bool `json:"fenced"`
}
