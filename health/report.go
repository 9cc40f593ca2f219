// Package health is what the agent knows about its node and how it tells everyone: probes (one file
// per check, run by a Runner), the agent's etcd membership view, the versioned Report, and the
// encrypted memberlist gossip that spreads reports and peer liveness.
package health

import (
	"bytes"
	"compress/gzip"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

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
	LeaderID  string       `json:"leaderID,omitempty"`
	RaftTerm  uint64       `json:"raftTerm,omitempty"`
	RaftIndex uint64       `json:"raftIndex,omitempty"`
	Alarms    []string     `json:"alarms,omitempty"`
	// Error says why the view is incomplete (the local member did not answer, …).
	Error      string    `json:"error,omitempty"`
	ObservedAt time.Time `json:"observedAt"`
}

// sameAs says whether v says what w says, as far as the hub judges from it: each member's
// reachability, the leader, the cluster and member IDs, the alarms, and whether the local member
// answered (the raft index and the time move on every view and are no news).
func (v *EtcdView) sameAs(w *EtcdView) bool {
	if w == nil || v.ClusterID != w.ClusterID || v.LocalID != w.LocalID || v.LeaderID != w.LeaderID || v.RaftTerm != w.RaftTerm ||
		(v.Error == "") != (w.Error == "") || len(v.Members) != len(w.Members) || !slices.Equal(v.Alarms, w.Alarms) {
		return false
	}
	for i, m := range v.Members {
		o := w.Members[i]
		if m.ID != o.ID || m.Name != o.Name || m.Learner != o.Learner || (m.Reachable == nil) != (o.Reachable == nil) ||
			m.Reachable != nil && *m.Reachable != *o.Reachable {
			return false
		}
	}
	return true
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

// Wire format: one format byte, then the body.
const (
	formatJSON byte = 1
	formatGzip byte = 2
	// formatSigned: an Ed25519 signature (64 bytes) by the sender's identity, then a report in one of
	// the formats above, which is what the signature covers.
	formatSigned byte = 3
	// compressAbove is the size past which a report is gzipped before it is gossiped.
	compressAbove = 512
	// maxDecoded bounds a decoded report (a gzip bomb stops here).
	maxDecoded = 1 << 20
)

// Encode writes r in the wire format, gzipped when large.
func (r *Report) Encode() ([]byte, error) { return r.encode(nil) }

// encode is Encode with a gzip writer to reuse (nil: a new one; allocating one per report costs
// more than everything else an idle agent does).
func (r *Report) encode(zw *gzip.Writer) ([]byte, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding report of %s: %w", r.Node, err)
	}
	if len(body) <= compressAbove {
		return append([]byte{formatJSON}, body...), nil
	}
	var buf bytes.Buffer
	buf.WriteByte(formatGzip)
	if zw == nil {
		zw = gzip.NewWriter(&buf)
	} else {
		zw.Reset(&buf)
	}
	if _, err := zw.Write(body); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// signReport wraps an encoded report in the signed format.
func signReport(id Identity, inner []byte) []byte {
	return append(append([]byte{formatSigned}, id.sign(inner)...), inner...)
}

// splitSigned unwraps a signed report: the report as signed and its signature (signed false: msg is
// not in the signed format, and is the report itself).
func splitSigned(msg []byte) (inner, sig []byte, signed bool) {
	if len(msg) < 1+ed25519.SignatureSize || msg[0] != formatSigned {
		return msg, nil, false
	}
	return msg[1+ed25519.SignatureSize:], msg[1 : 1+ed25519.SignatureSize], true
}

// DecodeReport reads a report in the wire format (a signed one's signature is not checked here: the
// gossip does that against the keys it pins). Garbage gives an error, never a panic.
func DecodeReport(b []byte) (*Report, error) {
	if len(b) == 0 {
		return nil, errors.New("empty report")
	}
	if b[0] == formatSigned {
		inner, _, ok := splitSigned(b)
		if !ok || len(inner) == 0 || inner[0] == formatSigned {
			return nil, errors.New("report: a signed report without a report in it")
		}
		b = inner
	}
	body := b[1:]
	switch b[0] {
	case formatJSON:
	case formatGzip:
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		body, err = io.ReadAll(io.LimitReader(zr, maxDecoded+1))
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		if len(body) > maxDecoded {
			return nil, fmt.Errorf("report: larger than %d bytes decoded", maxDecoded)
		}
	default:
		return nil, fmt.Errorf("report: unknown format %d", b[0])
	}
	var r Report
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if r.Node == "" {
		return nil, errors.New("report: no node name")
	}
	if r.Version == 0 {
		return nil, fmt.Errorf("report from %s: no version", r.Node)
	}
	return &r, nil
}
