package netns

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cut's rules stand in both hosts' chains, each host's applied at once; two overlapping cuts stand
// twice and an uncut takes one away; an uncut of a silent cut (INPUT only) takes away only what
// stands; the checker's hook sees every rule applied.
func TestCutsAndHeals(t *testing.T) {
	l := New(t) // root, iproute2 and iptables: test/run installs them
	a, b, c := l.Host("a"), l.Host("b"), l.Host("c")
	var seen []string
	l.OnRule(func(h *Host, args []string) { seen = append(seen, h.Name+" "+strings.Join(args, " ")) })
	drops := func(h *Host) []string {
		out, err := h.Run("iptables", "-w", "-S")
		require.NoError(t, err)
		var rules []string
		for _, line := range strings.Split(out, "\n") {
			if strings.HasSuffix(line, "-j DROP") {
				rules = append(rules, line)
			}
		}
		return rules
	}
	l.Cut([]*Host{a}, []*Host{b, c})
	assert.ElementsMatch(t, []string{"-A INPUT -s " + b.IP + "/32 -j DROP", "-A OUTPUT -d " + b.IP + "/32 -j DROP",
		"-A INPUT -s " + c.IP + "/32 -j DROP", "-A OUTPUT -d " + c.IP + "/32 -j DROP"}, drops(a))
	assert.ElementsMatch(t, []string{"-A INPUT -s " + a.IP + "/32 -j DROP", "-A OUTPUT -d " + a.IP + "/32 -j DROP"}, drops(b))
	assert.Len(t, seen, 8, "%q", seen)

	l.Cut([]*Host{a}, []*Host{b}) // overlapping: a-b stands twice
	assert.Len(t, drops(b), 4)
	l.Uncut([]*Host{a}, []*Host{b})
	assert.Len(t, drops(b), 2, "one cut of a-b stands")
	l.Uncut([]*Host{a}, []*Host{b, c})
	for _, h := range []*Host{a, b, c} {
		assert.Empty(t, drops(h), h.Name)
	}

	seen = nil
	l.CutSilently([]*Host{b}, []*Host{c})
	assert.Equal(t, []string{"-A INPUT -s " + c.IP + "/32 -j DROP"}, drops(b))
	l.Uncut([]*Host{b}, []*Host{c})
	assert.Empty(t, drops(b))
	assert.Empty(t, drops(c))
	assert.Equal(t, []string{"b -A INPUT -s " + c.IP + " -j DROP", "c -A INPUT -s " + b.IP + " -j DROP",
		"b -D INPUT -s " + c.IP + " -j DROP", "c -D INPUT -s " + b.IP + " -j DROP"}, seen, "only the rules that stood are taken away")
}
