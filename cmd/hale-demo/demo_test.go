package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The demo runs a scenario end to end and says so; an unknown scenario is named.
func TestDemo(t *testing.T) {
	var out, errOut bytes.Buffer
	err := runDemo(t.Context(), demoOptions{scenarios: []string{"nope"}}, &out, &errOut)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `--scenario: no scenario "nope"; known: stall, hang, panic, quorum-lost, quorum-lost-no-witness, partition, refused-reboot, pause, permanent-loss`)
	out.Reset()
	require.NoError(t, runDemo(t.Context(), demoOptions{scenarios: []string{"hang"}}, &out, &errOut), out.String())
	assert.Contains(t, out.String(), "✓ scenario hang passed")
	assert.Contains(t, out.String(), "summary: 1 of 1 scenarios passed")
}
