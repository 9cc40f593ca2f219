package recovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Step is how far a recovery got on this node; each is journaled once done.
type Step string

// The steps, in order.
const (
	StepChecked  Step = "Checked"  // every precondition held on the node
	StepStopped  Step = "Stopped"  // the member is stopped, its client port closed
	StepAside    Step = "Aside"    // its data directory's member/ moved aside
	StepRestored Step = "Restored" // the restored member/ in place
	StepStarted  Step = "Started"  // the one-member cluster answers, with a new cluster ID
	StepDone     Step = "Done"     // the node's control-plane static pods restarted onto it
)

var steps = []Step{StepChecked, StepStopped, StepAside, StepRestored, StepStarted, StepDone}

// after says whether s is at or past o.
func (s Step) after(o Step) bool {
	return indexOf(s) >= indexOf(o)
}

func indexOf(s Step) int {
	for i, x := range steps {
		if x == s {
			return i
		}
	}
	return -1
}

// Record is the journal of one recovery on this node (state directory's recovery.json).
type Record struct {
	Token        string    `json:"token"`
	Member       string    `json:"member"`
	OldClusterID string    `json:"oldClusterID"`
	NewClusterID string    `json:"newClusterID,omitempty"`
	PeerURL      string    `json:"peerURL"`
	DataDir      string    `json:"dataDir"`
	Aside        string    `json:"aside"`
	Bump         uint64    `json:"bumpRevision"`
	Revision     int64     `json:"revision,omitempty"`
	Step         Step      `json:"step"`
	Started      time.Time `json:"started"`
	Updated      time.Time `json:"updated"`
}

// journal is the state directory: the record and the lock that keeps a second recovery out.
type journal struct {
	dir  string
	lock *os.File
}

// openJournal takes the state directory's lock; a second `agent recover` on the node is refused.
func openJournal(dir string) (*journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another recovery is running on this node (pid %s holds %s): wait for it, or stop it first",
				strings.TrimSpace(string(b)), path)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &journal{dir: dir, lock: f}, nil
}

func (j *journal) close() { _ = j.lock.Close() }

func (j *journal) path() string { return filepath.Join(j.dir, "recovery.json") }

// read returns the journaled record (nil: none).
func (j *journal) read() (*Record, error) {
	b, err := os.ReadFile(j.path())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("recovery journal: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("recovery journal %s: %w (move it away only once you know etcd's state on this node)", j.path(), err)
	}
	return &r, nil
}

// write records r durably: a crash leaves the old record or the new one, never a torn one.
func (j *journal) write(r *Record) error {
	r.Updated = time.Now().UTC()
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileSync(j.path(), append(b, '\n')); err != nil {
		return fmt.Errorf("recovery journal: %w", err)
	}
	return nil
}

// writeFileSync writes path through a temporary file, synced, renamed, with the directory synced.
func writeFileSync(path string, b []byte) error {
	// A dot file: the kubelet reads every other file in its manifest directory as a static pod, and a
	// manifest written as etcd.yaml.tmp and renamed was a second pod of the same name to it (on a real
	// kubelet the manifest put back was then, now and then, never run).
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
