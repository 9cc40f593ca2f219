package health

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/health/identity"
)

// identities gives members identities and pins them: name → identity.
type identities map[string]identity.Identity

func (ids identities) pinned() identity.Pinned {
	keys := map[string][]identity.PublicKey{}
	for name, id := range ids {
		keys[name] = append(keys[name], id.Public())
	}
	return identity.PinnedOf(keys)
}

// as makes a member sign with id and check against pinned.
func as(id identity.Identity, pinned identity.Pinned) memberOpt {
	return func(c *GossipConfig) { c.Identity, c.Pinned = &id, &pinned }
}

// A process that holds the pool key (and a copy of the pinned keys, which are public) but not a
// member's identity key cannot speak for that member: while it runs, across its restart, under a name
// that is not pinned, nor by replaying its signed claim from another address. The real member comes
// back, and a member re-keyed with both keys pinned is heard throughout.
func TestIdentitiesStopAForger(t *testing.T) {
	ids := identities{"hub": identity.NewIdentity(), "cp-0": identity.NewIdentity(), "cp-1": identity.NewIdentity()}
	pinned := ids.pinned()
	hub, _ := startMember(t, "hub", as(ids["hub"], pinned))
	cp0, _ := startMember(t, "cp-0", as(ids["cp-0"], pinned))
	cp1, _ := startMember(t, "cp-1", as(ids["cp-1"], pinned))
	for _, g := range []*Gossip{cp0, cp1} {
		_, err := g.Join([]string{hub.Addr()})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return hub.ml.NumMembers() == 3 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, cp1.Publish(Report{Probes: []ProbeResult{{Name: "etcd", OK: true}}}))
	require.Eventually(t, func() bool { return len(hub.Reports()["cp-1"].Probes) == 1 }, 5*time.Second, 10*time.Millisecond)
	realAddr := cp1.Addr()

	forge := func(name string) *Gossip {
		f, _ := startMember(t, name, as(identity.NewIdentity(), pinned))
		_, _ = f.Join([]string{hub.Addr(), cp0.Addr()})
		_ = f.Publish(Report{Probes: []ProbeResult{{Name: "etcd", OK: false, Detail: "forged"}}})
		return f
	}
	rejected := func(reason string) func() bool {
		return func() bool { return hub.Rejected()[reason] > 0 && cp0.Rejected()[reason] > 0 }
	}

	// While the real cp-1 runs.
	f := forge("cp-1")
	require.Eventually(t, rejected("alive_bad_signature"), 5*time.Second, 10*time.Millisecond, "%v", hub.Rejected())
	require.Eventually(t, rejected(identity.RejectBadSignature), 5*time.Second, 10*time.Millisecond, "%v", hub.Rejected())
	require.NoError(t, f.Shutdown())

	// Across a restart of the real agent: the name is free, and memberlist would give it to a new
	// address after DeadNodeReclaimTime.
	require.NoError(t, cp1.Shutdown())
	require.Eventually(t, func() bool { return stateOf(hub, "cp-1") == PeerDead }, 10*time.Second, 10*time.Millisecond)
	f = forge("cp-1")
	time.Sleep(2 * memberlist.DefaultLANConfig().ProbeInterval)
	for range 3 {
		_ = f.Publish(Report{Probes: []ProbeResult{{Name: "etcd", OK: false, Detail: "forged"}}})
		time.Sleep(200 * time.Millisecond)
	}
	assert.Equal(t, PeerDead, stateOf(hub, "cp-1"), "the forger did not take the name over: the real cp-1 stays dead")
	for _, g := range []*Gossip{hub, cp0} {
		for _, p := range g.Reports()["cp-1"].Probes {
			assert.NotEqual(t, "forged", p.Detail, "no forged report is kept")
		}
		for _, n := range g.liveNodes() {
			assert.NotEqual(t, "cp-1", n.Name)
		}
	}
	require.NoError(t, f.Shutdown())

	// A name that is not pinned at all.
	f = forge("cp-9")
	require.Eventually(t, rejected("alive_unknown_node"), 5*time.Second, 10*time.Millisecond, "%v", hub.Rejected())
	assert.NotContains(t, hub.Reports(), "cp-9")
	require.NoError(t, f.Shutdown())

	// A member without an identity (an old agent, or a forger that signs nothing).
	plain, _ := startMember(t, "cp-0")
	_, _ = plain.Join([]string{hub.Addr()})
	require.Eventually(t, func() bool { return hub.Rejected()["alive_unsigned"] > 0 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, plain.Shutdown())

	// cp-1's own signed claim, replayed from another address, is refused; from its own it is taken.
	meta := (*delegate)(cp1).NodeMeta(memberlist.MetaMaxSize)
	check := (*aliveCheck)(hub)
	host, port, _ := net.SplitHostPort(realAddr)
	require.NoError(t, check.NotifyAlive(&memberlist.Node{Name: "cp-1", Addr: net.ParseIP(host), Port: portOf(t, port), Meta: meta}))
	err := check.NotifyAlive(&memberlist.Node{Name: "cp-1", Addr: net.ParseIP("127.0.0.1"), Port: portOf(t, port) + 1, Meta: meta})
	require.ErrorContains(t, err, "bad_signature")

	// The real cp-1 comes back, re-keyed: both keys pinned while it rotates, so it is heard at once.
	newKey := identity.NewIdentity()
	rotating := identity.PinnedOf(map[string][]identity.PublicKey{"hub": {ids["hub"].Public()}, "cp-0": {ids["cp-0"].Public()},
		"cp-1": {ids["cp-1"].Public(), newKey.Public()}})
	hub.SetPinned(rotating)
	cp0.SetPinned(rotating)
	back, _ := startMember(t, "cp-1", as(newKey, rotating))
	_, err = back.Join([]string{hub.Addr()})
	require.NoError(t, err)
	require.NoError(t, back.Publish(Report{Probes: []ProbeResult{{Name: "etcd", OK: true, Detail: "back"}}}))
	// (The hub may hold the old cp-1 dead at a higher incarnation until a push/pull, every 5 s, tells
	// the new one to refute: two of them, and more on a loaded machine, where 10 s were missed once.)
	require.Eventually(t, func() bool {
		return stateOf(hub, "cp-1") == PeerAlive && len(hub.Reports()["cp-1"].Probes) == 1 && hub.Reports()["cp-1"].Probes[0].Detail == "back"
	}, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return stateOf(cp0, "cp-1") == PeerAlive }, 10*time.Second, 10*time.Millisecond)
}

func portOf(t *testing.T, s string) uint16 {
	t.Helper()
	p, err := strconv.ParseUint(s, 10, 16)
	require.NoError(t, err)
	return uint16(p)
}

// A signed report: every receiver checks the writer's signature, relayed copies included, and a
// signed report that was tampered with fails it.
func TestSignedReports(t *testing.T) {
	id := identity.NewIdentity()
	inner, err := EncodeReport(&Report{Node: "cp-1", Cluster: "c", Version: 1})
	require.NoError(t, err)
	msg := signReport(id, inner)
	got, err := DecodeReport(msg)
	require.NoError(t, err)
	assert.Equal(t, "cp-1", got.Node)
	in, sig, signed := splitSigned(msg)
	require.True(t, signed)
	p := identity.PinnedOf(map[string][]identity.PublicKey{"cp-1": {id.Public()}})
	ok, _ := p.Verify("cp-1", in, sig)
	assert.True(t, ok)
	tampered := append([]byte(nil), msg...)
	tampered[len(tampered)-3] ^= 1
	in, sig, _ = splitSigned(tampered)
	ok, why := p.Verify("cp-1", in, sig)
	assert.False(t, ok)
	assert.Equal(t, identity.RejectBadSignature, why)
	_, err = DecodeReport(append([]byte{formatSigned}, sig...))
	assert.ErrorContains(t, err, "a signed report without a report in it")
	assert.True(t, strings.HasPrefix(id.Public().String(), "ed25519:"))
}
