package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The hub and the agent that ship link nothing of the demo or the test lab: no embedded etcd server,
// no BMC simulator, no test package, no testing framework (cmd/hale-demo has those). The agent links
// etcd's storage and restore code for `agent recover` (etcdutl's snapshot restore), never the
// embeddable server; the hub links no etcd server code at all.
func TestShippedBinariesLinkNoDemoOrTestCode(t *testing.T) {
	for _, pkg := range []string{"github.com/hale-dev/hale/cmd/hub", "github.com/hale-dev/hale/cmd/agent"} {
		etcdServer := "go.etcd.io/etcd/server/"
		if strings.HasSuffix(pkg, "/agent") {
			etcdServer = "go.etcd.io/etcd/server/v3/embed"
		}
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		require.NoError(t, err, "%s", out)
		deps := strings.Fields(string(out))
		require.Contains(t, deps, "github.com/hale-dev/hale/health", "the list is the binary's dependencies")
		for _, d := range deps {
			forbidden := d == "testing" || d == "net/http/httptest" || strings.HasPrefix(d, "github.com/hale-dev/hale/test/") ||
				strings.HasPrefix(d, "github.com/hale-dev/hale/bmc/bmcsim") || strings.HasPrefix(d, etcdServer) ||
				strings.HasPrefix(d, "github.com/stretchr/testify") || strings.Contains(d, "envtest")
			assert.False(t, forbidden, "%s links %s", pkg, d)
		}
	}
}
