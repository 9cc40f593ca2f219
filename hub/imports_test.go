package hub

import (
	"go/build"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPackageImports holds the boundaries of docs/hub-internals.md: what each package under hub/ may
// import directly. The assessor is pure (no clock but the one its observations carry, no lock, no
// I/O); degraded mode's rules know nothing of Kubernetes (kube runs them); and the hub itself reaches
// Kubernetes only through the interfaces kube implements.
func TestPackageImports(t *testing.T) {
	const mod = "github.com/hale-dev/hale/"
	io := []string{"context", "log/slog", "os", "net", "net/http", "sync", "math/rand/v2", "go.etcd.io/bbolt",
		"github.com/prometheus/", mod + "bmc", mod + "kube", mod + "hub"}
	k8s := []string{"k8s.io/", "sigs.k8s.io/", mod + "kube", mod + "api/"}
	for _, tc := range []struct {
		dir       string
		forbidden []string
	}{
		{"assess", io},
		{"assess/assesstest", io},
		{"degraded", k8s},
		// the journal keeps remediations; what they do and who decides them is the hub's
		// the executor carries out one remediation through the interfaces it owns (World, Power, Owner)
		{"execute", append([]string{"go.etcd.io/bbolt", "github.com/prometheus/", mod + "hub"}, k8s...)},
		{"journal", append([]string{"log/slog", "github.com/prometheus/", mod + "bmc", mod + "hub"}, k8s...)},
		{".", k8s},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			pkg, err := build.ImportDir(filepath.Clean(tc.dir), 0)
			require.NoError(t, err)
			require.NotEmpty(t, pkg.Imports)
			for _, imp := range pkg.Imports {
				bad := slices.ContainsFunc(tc.forbidden, func(f string) bool {
					return imp == f || strings.HasSuffix(f, "/") && strings.HasPrefix(imp, f)
				})
				assert.False(t, bad, "hub/%s imports %s, which it may not (docs/hub-internals.md)", tc.dir, imp)
			}
		})
	}
}
