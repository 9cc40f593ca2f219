// Package config reads Hale's YAML files strictly (an unknown field is an error that names it) and
// provides the value types they share.
package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/yaml"
)

// Duration reads "100ms", "2s", "5m" in YAML.
type Duration struct{ time.Duration }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration like \"500ms\" or \"2s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration like \"500ms\" or \"2s\", got %q", s)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// Or returns d, or def when d is zero.
func (d Duration) Or(def time.Duration) time.Duration {
	if d.Duration == 0 {
		return def
	}
	return d.Duration
}

// Load reads the YAML file at path into v strictly. Errors name the file (and the field, as far as
// the decoder says).
func Load(path string, v any) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := yaml.UnmarshalStrict(raw, v); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// RelativeTo makes each non-empty relative path in paths relative to the directory of file, the
// config file that names them (as kubectl reads a kubeconfig's files), not to the working directory:
// the same file means the same files under systemd, a shell or a container.
func RelativeTo(file string, paths ...*string) {
	dir := filepath.Dir(file)
	for _, p := range paths {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
}
