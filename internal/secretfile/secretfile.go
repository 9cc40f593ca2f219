// Package secretfile reads the files that hold secrets (gossip keys, BMC credentials, API tokens) and
// refuses those that others may read: a key on a shared host that any user can copy is no key.
package secretfile

import (
	"fmt"
	"io"
	"os"
	"slices"
	"syscall"
)

// Read returns the content of the file at path, once it has checked that nobody but its owner can
// read it: no permission for others, and group permissions only for a group this process is in other
// than root's (a Kubernetes Secret mounted with the pod's fsGroup is 0440, owned by that group).
// It checks the file it opened, not the path again.
func Read(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := check(path, info, ownGroup); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

// ownGroup says whether gid is this process's group or one of its supplementary groups.
func ownGroup(gid int) (bool, error) {
	groups, err := os.Getgroups()
	return gid == os.Getgid() || slices.Contains(groups, gid), err
}

func check(path string, info os.FileInfo, own func(gid int) (bool, error)) error {
	mode := info.Mode().Perm()
	fix := fmt.Sprintf("chmod 600 %s (a mounted Secret: defaultMode: 0400, or 0440 with the pod's fsGroup)", path)
	if mode&0o007 != 0 {
		return fmt.Errorf("%s has mode %04o: other users may read it; %s", path, mode, fix)
	}
	if mode&0o070 == 0 {
		return nil
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s has mode %04o and its group cannot be read: %s", path, mode, fix)
	}
	mine, err := own(int(st.Gid))
	if err != nil {
		return fmt.Errorf("%s has mode %04o, and this process's groups cannot be read (%w): %s", path, mode, err, fix)
	}
	if st.Gid == 0 || !mine {
		return fmt.Errorf("%s has mode %04o: group %d may read it, and it is not this process's own group; %s", path, mode, st.Gid, fix)
	}
	return nil
}
