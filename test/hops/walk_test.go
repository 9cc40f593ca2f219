package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPassWalk holds the reader's walk of one pass (docs/hub-internals.md): from Hub.pass through
// package hub's files, every other package read by its documentation, at most 40 hops between files
// and at most 10 of them back to a file already left. -v of the command lists the walk when it fails:
//
//	go run ./test/hops -v -only hub '(*github.com/hale-dev/hale/hub.Hub).pass'
func TestPassWalk(t *testing.T) {
	const module = "github.com/hale-dev/hale"
	w, err := walk("(*"+module+"/hub.Hub).pass", module, func(pkg string) bool { return pkg == module+"/hub" })
	require.NoError(t, err)
	t.Logf("%d functions in %d files, %d hops, %d back", len(w.steps), len(w.files), w.hops, w.back)
	assert.LessOrEqual(t, w.hops, 40, "hops between files on the walk of one pass")
	assert.LessOrEqual(t, w.back, 10, "hops back to a file already left on the walk of one pass")
	assert.Greater(t, len(w.steps), 30, "the walk reads the pass's functions (a walk that found nothing passes nothing)")
}
