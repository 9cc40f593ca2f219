// Package config reads Hale's YAML files strictly (an unknown field is an error that names it) and
// provides the value types they share.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"time"

	yaml3 "gopkg.in/yaml.v3"
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

// Load reads the YAML file at path into v strictly. what names the file for people ("inventory",
// "agent config"); an error says it, the file, the line and the field's path:
//
//	inventory /etc/hale/inventory.yaml:5: policy.maxUnhealty: unknown field; did you mean maxUnhealthy?
func Load(what, path string, v any) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var doc yaml3.Node
	if err := yaml3.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("%s %s: not YAML: %w", what, path, err)
	}
	root := &doc
	if doc.Kind == yaml3.DocumentNode && len(doc.Content) > 0 {
		root = doc.Content[0]
		if p := check(root, reflect.TypeOf(v), ""); p != nil {
			return fmt.Errorf("%s %s", what, p.in(path))
		}
	}
	if err := yaml.UnmarshalStrict(raw, v); err != nil {
		err = decodeError(err, root)
		var p *problem
		if errors.As(err, &p) {
			return fmt.Errorf("%s %s", what, p.in(path))
		}
		return fmt.Errorf("%s %s: %w", what, path, err)
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
