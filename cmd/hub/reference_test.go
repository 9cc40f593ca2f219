package main

import (
	"io"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/internal/cli"
	"github.com/hale-dev/hale/internal/docgen"
	"github.com/hale-dev/hale/kube"
)

// The reference pages under docs/reference are the hub as the code defines it: every command and
// flag (what --help prints), every setting of the inventory and of the HealthPolicy and Remediation
// objects with its type and description (the Go types' doc comments). A change to any of them fails
// this test until the page is rewritten (HALE_UPDATE_DOCS=1); a setting without a description fails
// it too.
func TestReferencePages(t *testing.T) {
	fields := func(v reflect.Type, prefix string) string {
		f, err := docgen.Fields("../..", v, prefix)
		require.NoError(t, err)
		assert.Empty(t, docgen.Undocumented(f), "settings of %v without a doc comment on their Go field", v)
		return docgen.Table(f)
	}
	t.Run("hub.md", func(t *testing.T) {
		docgen.Check(t, "../../docs/reference/hub.md", docgen.Header+`# The hub

Every command of `+"`hub`"+`, as `+"`--help`"+` prints it. The commands that read (status, explain, plan, check,
bmc power, version) take `+"`-o table|wide|json|yaml`"+`; durations and times are strings in JSON and YAML.
The operator commands reach a running hub over its socket (`+"`--socket`, or `$HALE_HUB_SOCKET`"+`), or its TCP
API with a bearer token.

`+docgen.Commands(newRootCommand(io.Discard, io.Discard)))
	})
	t.Run("inventory.md", func(t *testing.T) {
		docgen.Check(t, "../../docs/reference/inventory.md", docgen.Header+`# The inventory

The hub's file (`+"`hub run --inventory`, `hub check`, `hub bmc power MACHINE`"+`): the gossip pool, the
policy, the machine classes, the machines with their etcd members and BMCs, and the witnesses. YAML,
read strictly: an unknown setting is an error naming it with its line and the setting meant, when one
is near. Durations are Go durations (`+"`30s`, `5m`, `1h`"+`). A relative path is read from the inventory's own
directory. SIGHUP makes a running hub read it again (a bad file is logged and the previous one kept).
An example: [examples/inventory.yaml](../../examples/inventory.yaml).

`+fields(reflect.TypeFor[inventory.File](), ""))
	})
	t.Run("healthpolicy.md", func(t *testing.T) {
		docgen.Check(t, "../../docs/reference/healthpolicy.md", docgen.Header+`# HealthPolicy, Remediation and HaleRemediation (Kubernetes mode)

`+"`hale.dev/v1alpha1`"+`, namespaced (in `+"`hale-system`"+`). The CRDs are in `+"`deploy/crds`"+`.

## HealthPolicy

One per cluster, named `+"`default`"+`, created by the hub. Its spec is the policy and the operator's brakes
(it takes precedence over the inventory's `+"`policy`"+`); its status is what the hub sees.

`+fields(reflect.TypeFor[v1alpha1.HealthPolicySpec](), "spec")+`
`+fields(reflect.TypeFor[v1alpha1.HealthPolicyStatus](), "status")+`
The hub's records on it, as annotations (JSON; remove one only as its error message says):

| annotation | |
|---|---|
| `+"`"+kube.PausedByAnnotation+"`, `"+kube.SuspendedByAnnotation+"`"+` | who set `+"`spec.paused`"+` and `+"`spec.suspended`"+`, why, and since when |
| `+"`"+kube.RecoveryAnnotation+"`"+` | the last etcd recovery: its plan, the members it fenced, its new cluster; the members it retired are held until they rejoin |
| `+"`"+kube.MarkAnnotation+"`"+` | the raft mark: the highest raft index seen, with the etcd cluster's ID |

On a Cluster API Cluster (`+"`--capi-cluster`"+`), `+"`"+kube.ClusterPausedForAnnotation+"`"+` marks a pause Hale set for an etcd
recovery (beside `+"`cluster.x-k8s.io/paused`"+`): Hale lifts only a pause so marked.

## Remediation

One per remediation: the hub's journal in Kubernetes mode, and an operator's request for a reboot
(`+"`hub reboot --kubernetes`"+`, or created with kubectl: the hub checks it against the quorum plan and
records the outcome in it).

`+fields(reflect.TypeFor[v1alpha1.RemediationSpec](), "spec")+`
`+fields(reflect.TypeFor[v1alpha1.RemediationStatus](), "status")+`
## HaleRemediation and HaleRemediationTemplate (Cluster API)

Cluster API's external remediation: a MachineHealthCheck whose `+"`spec.remediation.templateRef`"+` names a
`+"`HaleRemediationTemplate`"+` (in its namespace) makes a `+"`HaleRemediation`"+` from its `+"`spec.template`"+` for each
Machine it finds unhealthy, named after the Machine, and deletes it once the Machine is healthy; the
hub carries it out and writes its status ([coexistence](../coexistence.md#cluster-api-machinehealthcheck-and-kubeadmcontrolplane)).

`+fields(reflect.TypeFor[v1alpha1.HaleRemediationSpec](), "spec")+`
`+fields(reflect.TypeFor[v1alpha1.HaleRemediationStatus](), "status"))
	})
}

// Every flag's help reads right: no backquotes pflag would take for its value's name, none empty.
func TestHelpReadsRight(t *testing.T) {
	assert.Empty(t, cli.HelpProblems(newRootCommand(io.Discard, io.Discard)))
}
