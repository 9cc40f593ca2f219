package docgen

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

var delimiterRow = regexp.MustCompile(`^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$`)

// cells counts a table row's cells as GitHub's Markdown splits them: at every pipe not escaped (`\|`),
// inside code spans too.
func cells(row string) int {
	row = strings.TrimSpace(row)
	row = strings.TrimPrefix(row, "|")
	if strings.HasSuffix(row, "|") && !strings.HasSuffix(row, `\|`) {
		row = row[:len(row)-1]
	}
	n := 1
	for i := 0; i < len(row); i++ {
		switch row[i] {
		case '\\':
			i++
		case '|':
			n++
		}
	}
	return n
}

// Every table of the README and the docs renders: its delimiter row and each of its rows have as many
// cells as its header (GitHub shows a table whose delimiter row differs as raw pipes, and drops a
// row's extra cells).
func TestDocTablesRender(t *testing.T) {
	tables := 0
	for _, page := range docPages(t) {
		b, err := os.ReadFile(page)
		require(t, err)
		lines := strings.Split(string(b), "\n")
		fenced := false
		for i := 0; i+1 < len(lines); i++ {
			if fenceStart.MatchString(lines[i]) {
				fenced = !fenced
			}
			if fenced || !strings.HasPrefix(strings.TrimSpace(lines[i]), "|") || !delimiterRow.MatchString(lines[i+1]) {
				continue
			}
			tables++
			width := cells(lines[i])
			if got := cells(lines[i+1]); got != width {
				t.Errorf("%s:%d: the table's header has %d cells, its delimiter row %d: it renders as text", page, i+1, width, got)
			}
			for j := i + 2; j < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[j]), "|"); j++ {
				if got := cells(lines[j]); got != width {
					t.Errorf("%s:%d: a row of %d cells in a table of %d (the header at line %d)", page, j+1, got, width, i+1)
				}
				i = j
			}
		}
	}
	if tables < 20 {
		t.Errorf("only %d tables found: the test no longer finds them", tables)
	}
}
