package secretfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		mode    os.FileMode
		group   int  // -1: leave the file's group as created
		inGroup bool // this process is in group (as a pod's processes are in its fsGroup)
		err     string
	}{
		{name: "owner only", mode: 0o600, group: -1},
		{name: "owner read only", mode: 0o400, group: -1},
		{name: "world readable", mode: 0o644, group: -1, err: "mode 0644: other users may read it; chmod 600"},
		{name: "others write only", mode: 0o602, group: -1, err: "mode 0602"},
		{name: "group of root", mode: 0o640, group: 0, err: "group 0 may read it"},
		{name: "a group this process is not in", mode: 0o440, group: 54321, err: "group 54321 may read it"},
		{name: "this process's own group (fsGroup)", mode: 0o440, group: 54321, inGroup: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.name)
			require.NoError(t, os.WriteFile(path, []byte("secret"), 0o600))
			if tt.group >= 0 {
				if err := os.Chown(path, -1, tt.group); err != nil {
					t.Fatalf("chown needs root (test/run runs as root): %v", err)
				}
			}
			require.NoError(t, os.Chmod(path, tt.mode))
			f, err := os.Open(path)
			require.NoError(t, err)
			defer f.Close()
			info, err := f.Stat()
			require.NoError(t, err)
			err = check(path, info, func(gid int) (bool, error) {
				own, err := ownGroup(gid)
				return own || (tt.inGroup && gid == tt.group), err
			})
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				assert.Contains(t, err.Error(), path, "the error names the file")
				assert.NotContains(t, err.Error(), "secret")
				return
			}
			require.NoError(t, err)
			if !tt.inGroup { // Read, as the process it is
				b, err := Read(path)
				require.NoError(t, err)
				assert.Equal(t, "secret", string(b))
			}
		})
	}
}
