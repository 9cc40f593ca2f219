package docgen

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const repo = "../.."

// blob is how the alerts' runbook_url and the systemd units name a page of the repository.
const blob = "https://github.com/hale-dev/hale/blob/main/"

var (
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	blobLink   = regexp.MustCompile(regexp.QuoteMeta(blob) + `[^\s"')]+`)
	notInSlug  = regexp.MustCompile(`[^a-z0-9 _-]`)
	fenceStart = regexp.MustCompile("^\\s*```")
)

// Every link of the README and the docs to a file of the repository, and every link to the
// repository's pages from the manifests (the alerts' runbook_url, the units' Documentation), points at
// a file that exists and, with #anchor, at a heading of it.
func TestDocLinks(t *testing.T) {
	checked := 0
	for _, page := range docPages(t) {
		b, err := os.ReadFile(page)
		require(t, err)
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			switch {
			case strings.HasPrefix(target, blob):
				target = filepath.Join(repo, strings.TrimPrefix(target, blob))
			case strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:"):
				continue
			case strings.HasPrefix(target, "#"):
				target = page + target
			default:
				target = filepath.Join(filepath.Dir(page), target)
			}
			checkLink(t, page, m[1], target)
			checked++
		}
	}
	require(t, filepath.WalkDir(filepath.Join(repo, "deploy"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, l := range blobLink.FindAllString(string(b), -1) {
			checkLink(t, p, l, filepath.Join(repo, strings.TrimPrefix(l, blob)))
			checked++
		}
		return nil
	}))
	if checked < 50 {
		t.Errorf("only %d links checked: the test no longer finds them", checked)
	}
}

// docPages are the README, the CHANGELOG and every page under docs/.
func docPages(t *testing.T) []string {
	pages := []string{filepath.Join(repo, "README.md"), filepath.Join(repo, "CHANGELOG.md")}
	require(t, filepath.WalkDir(filepath.Join(repo, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".md") {
			pages = append(pages, p)
		}
		return err
	}))
	return pages
}

func require(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// checkLink fails when target (a path, maybe with #anchor) is not a file of the repository, or the
// anchor no heading of it.
func checkLink(t *testing.T, page, link, target string) {
	t.Helper()
	path, anchor, _ := strings.Cut(target, "#")
	if _, err := os.Stat(path); err != nil {
		t.Errorf("%s: link %s: no such file %s", page, link, path)
		return
	}
	if anchor == "" || !strings.HasSuffix(path, ".md") {
		return
	}
	if !anchors(t, path)[anchor] {
		t.Errorf("%s: link %s: %s has no heading #%s", page, link, path, anchor)
	}
}

// anchors are the anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as
// hyphens (code blocks' lines are not headings).
func anchors(t *testing.T, path string) map[string]bool {
	b, err := os.ReadFile(path)
	require(t, err)
	out := map[string]bool{}
	fenced := false
	for l := range strings.SplitSeq(string(b), "\n") {
		if fenceStart.MatchString(l) {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		out[strings.ReplaceAll(notInSlug.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
	}
	return out
}
