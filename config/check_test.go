package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type testFile struct {
	Name    string   `json:"name"`
	Timeout Duration `json:"timeout"`
	Gossip  struct {
		ProbeInterval Duration `json:"probeInterval"`
		Join          []string `json:"join"`
	} `json:"gossip"`
	Items []struct {
		Name    string `json:"name"`
		Enabled bool   `json:"enabled"`
	} `json:"items"`
	Labels map[string]struct {
		Value int `json:"value"`
	} `json:"labels"`
}

// Errors in a YAML file say where: the file, the line, the field's path, and for a typo the field meant.
func TestLoadSaysWhere(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"fine", "name: a\ntimeout: 2s\ngossip: {probeInterval: 100ms, join: [a, b]}\nitems: [{name: x, enabled: true}]\nlabels: {k: {value: 1}}\n", ""},
		{"a typo", "name: a\ngossip:\n  probeIntervall: 1s\n", "f.yaml:3: gossip.probeIntervall: unknown field; did you mean probeInterval?"},
		{"two letters swapped", "naem: a\n", "f.yaml:1: naem: unknown field; did you mean name?"},
		{"no field like it", "colour: blue\n", "f.yaml:1: colour: unknown field"},
		{"a field of a named list item", "items:\n  - name: x\n    enabeld: true\n", "f.yaml:3: items[0] (x).enabeld: unknown field; did you mean enabled?"},
		{"a field inside a map", "labels:\n  k: {valeu: 1}\n", "f.yaml:2: labels.k.valeu: unknown field; did you mean value?"},
		{"a bad duration", "timeout: 2 seconds\n", `f.yaml:1: timeout: want a duration like "500ms" or "2s", got "2 seconds"`},
		{"a list for a mapping", "gossip: [a]\n", "f.yaml:1: gossip: want a mapping (key: value lines), got a list"},
		{"a mapping for a string", "name: {a: b}\n", "f.yaml:1: name: want a string, got a mapping"},
		{"a word for a number", "labels: {k: {value: one}}\n", `f.yaml:1: labels.k.value: want a whole number, got "one"`},
		{"a word for a boolean", "items: [{name: x, enabled: maybe}]\n", `f.yaml:1: items[0] (x).enabled: want true or false, got "maybe"`},
		{"yes is a boolean, as YAML 1.1 says", "items: [{name: x, enabled: yes}]\n", ""},
		{"case is forgiven, as encoding/json does", "NAME: a\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tt.body), 0o600))
			var f testFile
			err := Load("test file", path, &f)
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, "test file "+filepath.Dir(path)+"/"+tt.want, err.Error())
		})
	}
}
