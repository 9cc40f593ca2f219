package buildinfo

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestString(t *testing.T) {
	tests := []struct {
		name string
		info Info
		want string
	}{
		{"a release build", Info{Version: "v0.4.0", Commit: "1a2b3c4d5e6f7a8b9c0d", Date: "2026-11-26T02:00:00Z", Go: "go1.26.0", Platform: "linux/amd64"},
			"v0.4.0 (commit 1a2b3c4d5e6f, built 2026-11-26T02:00:00Z, go1.26.0 linux/amd64)"},
		{"go build in a work tree with changes", Info{Version: "dev", Commit: "1a2b3c4d5e6f7a8b", Modified: true, CommitDate: "2026-11-25T10:00:00Z", Go: "go1.26.0", Platform: "linux/arm64"},
			"dev (commit 1a2b3c4d5e6f (modified), committed 2026-11-25T10:00:00Z, go1.26.0 linux/arm64)"},
		{"outside a repository", Info{Version: "dev", Go: "go1.26.0", Platform: "linux/amd64"}, "dev (commit unknown, go1.26.0 linux/amd64)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, tt.info.String()) })
	}
	assert.NotEmpty(t, Get().Go)
}
