package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// A document is checked against the Go type it decodes into before it is decoded, so that an error
// says where: the file's line and the field's path (`policy.maxUnhealty: unknown field; did you mean
// maxUnhealthy?`), where the JSON decoder under sigs.k8s.io/yaml would say `json: unknown field
// "maxUnhealty"` for a YAML file, with neither.

// problem is what check found, and where.
type problem struct {
	line int
	path string
	msg  string
}

func (p *problem) Error() string {
	if p.path == "" {
		return p.msg
	}
	return p.path + ": " + p.msg
}

// in says the problem where it is: "FILE:LINE: PATH: MSG".
func (p *problem) in(file string) string {
	if p.line > 0 {
		file += ":" + strconv.Itoa(p.line)
	}
	return file + ": " + p.Error()
}

var (
	durationType    = reflect.TypeFor[Duration]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// check walks node (a YAML document's root) against t and returns the first problem: an unknown field
// (with the known one it most resembles), a mapping, sequence or scalar where another is wanted, a
// duration that does not parse. Types with a decoder of their own are left to it.
func check(node *yaml.Node, t reflect.Type, path string) *problem {
	for node.Kind == yaml.AliasNode && node.Alias != nil {
		node = node.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if node.Kind == yaml.ScalarNode && node.Tag == "!!null" {
		return nil
	}
	at := func(format string, args ...any) *problem {
		return &problem{line: node.Line, path: path, msg: fmt.Sprintf(format, args...)}
	}
	if t == durationType {
		if node.Kind != yaml.ScalarNode {
			return at("want a duration like \"500ms\" or \"2s\"")
		}
		if _, err := time.ParseDuration(node.Value); err != nil {
			return at("want a duration like \"500ms\" or \"2s\", got %q", node.Value)
		}
		return nil
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) || t.Implements(unmarshalerType) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if node.Kind != yaml.MappingNode {
			return at("want a mapping (key: value lines), got %s", describe(node))
		}
		fields := jsonFields(t)
		for i := 0; i+1 < len(node.Content); i += 2 {
			k, v := node.Content[i], node.Content[i+1]
			if k.Value == "<<" {
				continue
			}
			f, ok := lookup(fields, k.Value)
			if !ok {
				msg := "unknown field"
				if s := suggest(k.Value, fields); s != "" {
					msg += "; did you mean " + s + "?"
				}
				return &problem{line: k.Line, path: join(path, k.Value), msg: msg}
			}
			if p := check(v, f.Type, join(path, k.Value)); p != nil {
				return p
			}
		}
	case reflect.Map:
		if node.Kind != yaml.MappingNode {
			return at("want a mapping (key: value lines), got %s", describe(node))
		}
		for i := 0; i+1 < len(node.Content); i += 2 {
			if p := check(node.Content[i+1], t.Elem(), join(path, node.Content[i].Value)); p != nil {
				return p
			}
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return nil // []byte: a string
		}
		if node.Kind != yaml.SequenceNode {
			return at("want a list, got %s", describe(node))
		}
		for i, e := range node.Content {
			if p := check(e, t.Elem(), path+"["+strconv.Itoa(i)+"]"+named(e)); p != nil {
				return p
			}
		}
	default:
		if node.Kind != yaml.ScalarNode {
			return at("want %s, got %s", kindWord(t), describe(node))
		}
		if !scalarFits(node, t) {
			return at("want %s, got %q", kindWord(t), node.Value)
		}
	}
	return nil
}

// scalarFits says whether the scalar decodes into t as sigs.k8s.io/yaml reads it (YAML 1.1's yes/no
// are booleans there).
func scalarFits(n *yaml.Node, t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool:
		switch strings.ToLower(n.Value) {
		case "true", "false", "yes", "no", "on", "off", "y", "n":
			return n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0
		}
		return false
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return n.Tag == "!!int"
	case reflect.Float32, reflect.Float64:
		return n.Tag == "!!int" || n.Tag == "!!float"
	}
	return true
}

// jsonFields are t's fields by their JSON names, embedded structs' included (as encoding/json sees them).
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
			continue
		case f.Anonymous && name == "":
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range jsonFields(ft) {
					if _, ok := out[k]; !ok {
						out[k] = v
					}
				}
				continue
			}
		case !f.IsExported():
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f
	}
	return out
}

// lookup finds key as encoding/json does: the exact name, else one that differs only in case.
func lookup(fields map[string]reflect.StructField, key string) (reflect.StructField, bool) {
	if f, ok := fields[key]; ok {
		return f, true
	}
	for name, f := range fields {
		if strings.EqualFold(name, key) {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// suggest is the known field closest to key, when it is close enough to be a typo.
func suggest(key string, fields map[string]reflect.StructField) string {
	best, bestD := "", 1+max(2, len(key)/4)
	for name := range fields {
		if d := distance(strings.ToLower(key), strings.ToLower(name)); d < bestD || d == bestD && name < best {
			best, bestD = name, d
		}
	}
	if bestD > max(2, len(key)/4) {
		return ""
	}
	return best
}

// distance is the edit distance between a and b (insertions, deletions, substitutions, and swaps of
// two neighbours: the usual typos).
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range rb {
		d[0][j+1] = j + 1
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// named is " (NAME)" for a list item with a name: field, as the inventory's own errors say it.
func named(n *yaml.Node) string {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == "name" && n.Content[i+1].Kind == yaml.ScalarNode {
				return " (" + n.Content[i+1].Value + ")"
			}
		}
	}
	return ""
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}

func kindWord(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "a value"
}

// decodeError makes what the JSON decoder says of a YAML file say it in YAML's words: the field's path
// (and its line, found in node) instead of "error unmarshaling JSON: while decoding JSON: json:".
func decodeError(err error, node *yaml.Node) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		line := lineOf(node, te.Field)
		return &problem{line: line, path: te.Field, msg: fmt.Sprintf("want %s, got a %s", kindWord(te.Type), te.Value)}
	}
	msg := err.Error()
	for _, prefix := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	return errors.New(msg)
}

// lineOf is the line of the field at the dotted path in node (0 when it is not found).
func lineOf(node *yaml.Node, path string) int {
	n := node
	for _, key := range strings.Split(path, ".") {
		for n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		if n.Kind != yaml.MappingNode {
			return 0
		}
		found := false
		for i := 0; i+1 < len(n.Content); i += 2 {
			if strings.EqualFold(n.Content[i].Value, key) {
				n, found = n.Content[i+1], true
				break
			}
		}
		if !found {
			return 0
		}
	}
	return n.Line
}
