package docgen

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// figure is a measured quantity as a doc writes it: "0.5 s", "499 ms", "1 min 4 s", "1.2 GiB", a
// range "17–18 s".
var figure = regexp.MustCompile(`(?:(\d+(?:\.\d+)?)[–-])?(\d+(?:\.\d+)?)\s?(ms|s|min|minutes|GiB|MiB)\b(?:\s(\d+)\s?s\b)?`)

// numbered is the start of a numbered list's item.
var numbered = regexp.MustCompile(`^\d+\. `)

// testingLink is a link from the README to docs/testing.md, maybe to one of its sections.
var testingLink = regexp.MustCompile(`\]\(docs/testing\.md(?:#([^)\s]+))?\)`)

// A measured figure of the README (outside code blocks: those are sample output) is one that
// docs/testing.md has too: each paragraph (or bullet) that quotes a figure links to testing.md, and
// the section it links to has the same quantity, written in any unit and rounded as the README
// rounds it (499 ms is the README's 0.5 s). A figure is changed in testing.md, where the run that
// measured it is written down, and then in the README, or this test fails.
func TestREADMEFiguresAreMeasured(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repo, "README.md"))
	require(t, err)
	testingDoc, err := os.ReadFile(filepath.Join(repo, "docs", "testing.md"))
	require(t, err)
	quoted := 0
	for _, para := range paragraphs(string(readme)) {
		figs := figure.FindAllStringSubmatch(para, -1)
		if len(figs) == 0 {
			continue
		}
		links := testingLink.FindAllStringSubmatch(para, -1)
		if len(links) == 0 {
			t.Errorf("README.md: %q quotes %s with no link to docs/testing.md, where the run that measured it is written down", excerpt(para), figs[0][0])
			continue
		}
		var measured []quantity
		for _, l := range links {
			measured = append(measured, quantities(section(string(testingDoc), l[1]))...)
		}
		for _, f := range figs {
			quoted++
			for _, q := range parseQuantities(f) {
				assert.True(t, q.in(measured), "README.md quotes %q (in %q); docs/testing.md%s has no such figure", f[0], excerpt(para), anchorOf(links))
			}
		}
	}
	if quoted < 5 {
		t.Errorf("only %d figures found in the README: the test no longer finds them", quoted)
	}
}

// paragraphs are the README's paragraphs and bullets outside code blocks.
func paragraphs(doc string) []string {
	var out []string
	var cur []string
	fenced := false
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.Join(cur, " "))
			cur = nil
		}
	}
	for l := range strings.SplitSeq(doc, "\n") {
		switch {
		case fenceStart.MatchString(l):
			flush()
			fenced = !fenced
		case fenced:
		case strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#"):
			flush()
		case strings.HasPrefix(l, "- ") || numbered.MatchString(l):
			flush()
			cur = append(cur, l)
		default:
			cur = append(cur, l)
		}
	}
	flush()
	return out
}

// section is the text under the heading with that anchor (up to the next heading of the same or a
// higher level), or the whole doc for no anchor.
func section(doc, anchor string) string {
	if anchor == "" {
		return doc
	}
	lines := strings.Split(doc, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		level := len(l) - len(strings.TrimLeft(l, "#"))
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		if strings.ReplaceAll(notInSlug.ReplaceAllString(strings.ToLower(h), ""), " ", "-") != anchor {
			continue
		}
		end := len(lines)
		for j := i + 1; j < len(lines); j++ {
			if strings.HasPrefix(lines[j], "#") && len(lines[j])-len(strings.TrimLeft(lines[j], "#")) <= level {
				end = j
				break
			}
		}
		return strings.Join(lines[i:end], "\n")
	}
	return ""
}

// quantity is a figure in a base unit (seconds or bytes) and the number of decimals it was written
// with in that unit.
type quantity struct {
	value    float64
	kind     string
	unit     float64 // the written unit, in the base unit
	decimals int
}

// parseQuantities are the quantities of a figure: one, or a range's two ends.
func parseQuantities(m []string) []quantity {
	var out []quantity
	for _, n := range []string{m[1], m[2]} {
		if n == "" {
			continue
		}
		v, _ := strconv.ParseFloat(n, 64)
		q := quantity{kind: "time"}
		if _, frac, ok := strings.Cut(n, "."); ok {
			q.decimals = len(frac)
		}
		switch m[3] {
		case "ms":
			q.unit = 0.001
		case "s":
			q.unit = 1
		case "min", "minutes":
			q.unit = 60
		case "MiB":
			q.kind, q.unit = "size", 1<<20
		case "GiB":
			q.kind, q.unit = "size", 1<<30
		}
		q.value = v * q.unit
		if m[4] != "" { // "1 min 4 s"
			s, _ := strconv.ParseFloat(m[4], 64)
			q.value += s
			q.unit = 1
		}
		out = append(out, q)
	}
	return out
}

func quantities(text string) []quantity {
	var out []quantity
	for _, m := range figure.FindAllStringSubmatch(text, -1) {
		out = append(out, parseQuantities(m)...)
	}
	return out
}

// in: some measured quantity of the same kind, written in q's unit and rounded to q's decimals, is q.
func (q quantity) in(measured []quantity) bool {
	scale := math.Pow(10, float64(q.decimals))
	want := math.Round(q.value/q.unit*scale) / scale
	for _, m := range measured {
		if m.kind == q.kind && math.Round(m.value/q.unit*scale)/scale == want {
			return true
		}
	}
	return false
}

func excerpt(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

func anchorOf(links [][]string) string {
	var out []string
	for _, l := range links {
		if l[1] != "" {
			out = append(out, "#"+l[1])
		}
	}
	return strings.Join(out, ", ")
}
