package health

import (
	"crypto/ed25519"
	"encoding/binary"
	"testing"
	"time"

	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/internal/logdedup"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleReport(probes int) Report {
	r := Report{Node: "cp-1", Cluster: "prod", Version: 42, SentAt: time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC),
		Etcd: &EtcdView{LocalName: "cp-1", Members: []EtcdMember{{ID: "8e9e05c52164694d", Name: "cp-1"}}, RaftTerm: 3}}
	for i := range probes {
		r.Probes = append(r.Probes, ProbeResult{Name: "p", OK: i%2 == 0, Detail: "detail of a probe, long enough to make a big report"})
	}
	return r
}

func TestReportRoundTrip(t *testing.T) {
	for _, n := range []int{1, 50} {
		r := sampleReport(n)
		b, err := EncodeReport(&r)
		require.NoError(t, err)
		if n == 50 {
			assert.Equal(t, formatGzip, b[0], "a large report is compressed")
		} else {
			assert.Equal(t, formatJSON, b[0])
		}
		got, err := DecodeReport(b)
		require.NoError(t, err)
		assert.Equal(t, r, *got)
	}
	for _, bad := range [][]byte{nil, {9}, {formatJSON}, {formatGzip, 1, 2}, append([]byte{formatJSON}, `{"version":1}`...)} {
		_, err := DecodeReport(bad)
		assert.Error(t, err)
	}
}

// FuzzDecoders feeds random bytes to every gossip decoder: the report decoder and the push/pull
// state merger. Garbage gives errors (counted), never a panic.
func FuzzDecoders(f *testing.F) {
	small, _ := EncodeReport(&Report{Node: "a", Cluster: "c", Version: 1})
	big := sampleReport(50)
	large, _ := EncodeReport(&big)
	f.Add(small)
	f.Add(large)
	f.Add(binary.AppendUvarint(nil, uint64(len(small))))
	f.Add(append(binary.AppendUvarint(nil, uint64(len(small))), small...))
	f.Add([]byte{formatGzip, 0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff})
	id := identity.NewIdentity()
	f.Add(signReport(id, small))
	member := func(own *identity.Identity) *Gossip {
		return &Gossip{cfg: GossipConfig{Node: "self", Cluster: "c", Identity: own}, reports: map[string]*Report{}, encoded: map[string][]byte{},
			addrs: map[string]string{}, reported: map[string]string{}, rejected: map[string]int{}, expired: map[string]uint64{},
			dedup: logdedup.New(discardLogger()), pinned: identity.PinnedOf(map[string][]identity.PublicKey{"a": {id.Public()}})}
	}
	g, signed := member(nil), member(&id) // the second checks signatures
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeReport(b); err == nil && (r.Node == "" || r.Version == 0) {
			t.Fatalf("accepted a report without node or version: %+v", r)
		}
		(*delegate)(g).MergeRemoteState(b, false)
		_, _ = g.merge(b)
		if r, kept := signed.merge(b); kept {
			if in, sig, ok := splitSigned(b); !ok || !ed25519.Verify(ed25519.PublicKey(id.Public()), in, sig) || r.Node != "a" {
				t.Fatalf("kept a report its writer's key did not sign: %+v", r)
			}
		}
	})
}
