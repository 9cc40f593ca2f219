package main

import (
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/internal/cli"
	"github.com/hale-dev/hale/internal/docgen"
)

// docs/reference/agent.md is the agent as the code defines it: its commands and flags (what --help
// prints), every setting of its configuration file with its type and description (the Go types' doc
// comments), and every probe (the registry). A change to any of them fails this test until the page
// is rewritten (HALE_UPDATE_DOCS=1); a setting without a description fails it too.
func TestReferencePage(t *testing.T) {
	var b strings.Builder
	b.WriteString(docgen.Header)
	b.WriteString(`# The agent

One agent runs on every control-plane node (and on each witness host). It probes the node, reads
etcd's membership from the local member (a witness: from outside) and gossips a versioned report to
every peer. It never acts. Flags override the configuration file; a relative path in the file is read
from the file's own directory.

`)
	b.WriteString(docgen.Commands(newRootCommand(io.Discard, io.Discard, nil)))
	b.WriteString(`## Configuration file

YAML, read strictly: an unknown setting is an error that names it, with its line. Durations are written
as Go durations (` + "`500ms`, `5s`, `1m30s`" + `). Only ` + "`cluster`" + ` and ` + "`gossip.keyFile`" + ` are required.

`)
	fields, err := docgen.Fields("../..", reflect.TypeFor[Config](), "")
	require.NoError(t, err)
	for _, k := range health.ProbeKinds() {
		pf, err := docgen.Fields("../..", reflect.TypeOf(k.Section()).Elem(), "probes."+k.Name)
		require.NoError(t, err)
		fields = append(fields, pf...)
	}
	assert.Empty(t, docgen.Undocumented(fields), "settings without a doc comment on their Go field")
	b.WriteString(docgen.Table(fields))
	b.WriteString(`
## Probes

Each probe has a section under ` + "`probes`" + ` (` + "`enabled`, `interval`, `timeout`" + ` and its own settings above). A
probe's failure makes its machine Unhealthy once it has lasted the hub's ` + "`policy.probeTimeouts`" + ` for it
(the default below); some are reported and shown but never judged.

| probe | Unhealthy after (hub default) | checks |
|---|---|---|
`)
	for _, k := range health.ProbeKinds() {
		judged := "never (reported only)"
		if k.Judged > 0 {
			judged = k.Judged.String()
		}
		b.WriteString("| `" + k.Name + "` | " + judged + " | " + k.Help + " |\n")
	}
	docgen.Check(t, "../../docs/reference/agent.md", b.String())
}

// Every flag's help reads right: no backquotes pflag would take for its value's name, none empty.
func TestHelpReadsRight(t *testing.T) {
	assert.Empty(t, cli.HelpProblems(newRootCommand(io.Discard, io.Discard, nil)))
}
