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

	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/health/report"
)

// The report's values live in the leaf package health/report (the hub's pure packages read them
// from there); these are their names here.
type (
	ProbeResult = report.ProbeResult
	EtcdMember  = report.EtcdMember
	EtcdView    = report.EtcdView
	PeerState   = report.PeerState
	PeerView    = report.PeerView
	Report      = report.Report
)

// Peer states.
const (
	PeerAlive = report.PeerAlive
	PeerDead  = report.PeerDead
	PeerLeft  = report.PeerLeft
)

// sameView says whether v says what w says, as far as the hub judges from it: each member's
// reachability, the leader, the cluster and member IDs, the alarms, and whether the local member
// answered (the raft index and the time move on every view and are no news).
func sameView(v, w *EtcdView) bool {
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

// EncodeReport writes r in the wire format, gzipped when large.
func EncodeReport(r *Report) ([]byte, error) { return encodeReport(r, nil) }

// encodeReport is EncodeReport with a gzip writer to reuse (nil: a new one; allocating one per report
// costs more than everything else an idle agent does).
func encodeReport(r *Report, zw *gzip.Writer) ([]byte, error) {
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
func signReport(id identity.Identity, inner []byte) []byte {
	return append(append([]byte{formatSigned}, id.Sign(inner)...), inner...)
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
