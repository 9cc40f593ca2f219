// Package buildinfo says which build of Hale is running: its version, the commit it was built from,
// when, with which Go, for which platform. `hub version` and `agent version` print it, and both log it
// at start, so that a bug report names the build.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set at build time (deploy/image/build-binaries):
//
//	-X github.com/hale-dev/hale/internal/buildinfo.version=v0.4.0
//	-X github.com/hale-dev/hale/internal/buildinfo.commit=1a2b3c4d…
//	-X github.com/hale-dev/hale/internal/buildinfo.date=2026-11-26T02:00:00Z
//
// Without them, the version is "dev" and the commit and its time come from what `go build` records of
// the repository it built in (absent outside one, or with -buildvcs=false).
var version, commit, date string

// Info is one build.
type Info struct {
	Version  string `json:"version"`
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	// Date is when it was built (or, without that, when its commit was made: CommitDate).
	Date       string `json:"date,omitempty"`
	CommitDate string `json:"commitDate,omitempty"`
	Go         string `json:"go"`
	Platform   string `json:"platform"`
}

// Get returns this binary's build.
func Get() Info {
	i := Info{Version: version, Date: date, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if i.Version == "" {
		i.Version = "dev"
	}
	if commit != "" {
		i.Commit, i.Modified = strings.CutSuffix(commit, "-dirty")
		return i
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Commit = s.Value
			case "vcs.time":
				i.CommitDate = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	return i
}

// String is the one line `version` prints: "hub v0.4.0 (commit 1a2b3c4d5e6f, built 2026-11-26T02:00:00Z,
// go1.26.0 linux/amd64)".
func (i Info) String() string {
	commit := "commit unknown"
	if i.Commit != "" {
		commit = "commit " + i.Commit[:min(12, len(i.Commit))]
		if i.Modified {
			commit += " (modified)"
		}
	}
	when := ""
	switch {
	case i.Date != "":
		when = ", built " + i.Date
	case i.CommitDate != "":
		when = ", committed " + i.CommitDate
	}
	return fmt.Sprintf("%s (%s%s, %s %s)", i.Version, commit, when, i.Go, i.Platform)
}
