// Package boltfile is the standalone hub's journal: the remediations (package journal's values)
// in a bbolt file, with the epoch that fences a hub which is no longer the one writing.
package boltfile

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/hale-dev/hale/hub/journal"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

var (
	bucketMeta = []byte("meta")
	bucketRems = []byte("remediations")
	keyEpoch   = []byte("epoch")
)

// File is the standalone hub's record of remediations, in a bbolt file: intent before each side
// effect, outcome after, so that a restarted hub resumes exactly where the last one stopped. Each
// opening takes a new epoch; a journal whose stored epoch moved past its own refuses to write.
type File struct {
	db      *bolt.DB
	path    string
	epoch   uint64
	maxDone int
	now     func() time.Time
}

// Open opens (or creates) the journal at path and takes the next epoch. keepFinished bounds the
// finished remediations kept per machine (default 20).
func Open(path string, keepFinished int) (*File, error) {
	if keepFinished <= 0 {
		keepFinished = 20
	}
	if dir := filepath.Dir(path); dir != "" {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("journal %s: its directory %s does not exist or is no directory: create it (owned by the hub's user, mode 0700) "+
				"or give another path (--journal)", path, dir)
		}
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, fmt.Errorf("journal %s is locked by another process (is another hub running?)", path)
	case err != nil:
		return nil, fmt.Errorf("journal %s: %w (move the file aside to start with an empty journal; the old one is kept for inspection)", path, err)
	}
	j := &File{db: db, path: path, maxDone: keepFinished, now: func() time.Time { return time.Now().UTC() }}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(bucketRems); err != nil {
			return err
		}
		if v := meta.Get(keyEpoch); len(v) == 8 {
			j.epoch = binary.BigEndian.Uint64(v)
		}
		j.epoch++
		return meta.Put(keyEpoch, binary.BigEndian.AppendUint64(nil, j.epoch))
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	return j, nil
}

// Path is the file's.
func (j *File) Path() string { return j.path }

// Epoch is this writer's epoch.
func (j *File) Epoch() uint64 { return j.epoch }

// Close closes the file.
func (j *File) Close() error { return j.db.Close() }

// update runs f on the remediations in a write transaction after checking that no newer epoch took
// over.
func (j *File) update(f func(rems *bolt.Bucket) error) error {
	return j.updateTx(func(tx *bolt.Tx) error { return f(tx.Bucket(bucketRems)) })
}

func (j *File) updateTx(f func(tx *bolt.Tx) error) error {
	return j.db.Update(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyEpoch); binary.BigEndian.Uint64(v) != j.epoch {
			return fmt.Errorf("journal %s: %w (epoch %d, journal at %d)", j.path, journal.ErrStaleEpoch, j.epoch, binary.BigEndian.Uint64(v))
		}
		return f(tx)
	})
}

// Begin records a new remediation; it fails with ErrActive when the machine has one in progress.
func (j *File) Begin(_ context.Context, r journal.Remediation) (journal.Remediation, error) {
	if r.Machine == "" || strings.Contains(r.Machine, "/") {
		return r, fmt.Errorf("journal: machine name %q must be non-empty and without /", r.Machine)
	}
	now := j.now()
	if r.ID != "" {
		return r, fmt.Errorf("journal: %s: adopting a request object is Kubernetes mode's (Remediation objects), not the bbolt journal's", r.ID)
	}
	r.ID = fmt.Sprintf("%s/%s", r.Machine, now.Format("20060102T150405.000000000Z"))
	r.State, r.Created, r.Updated = journal.InProgress, now, now
	r.History = []journal.Entry{{At: now, Step: -1, Kind: journal.EntryNote, Detail: "begun: " + r.Reason, Epoch: j.epoch}}
	err := j.update(func(b *bolt.Bucket) error {
		if active, err := activeOf(b, r.Machine); err != nil {
			return err
		} else if active != nil {
			return fmt.Errorf("%s: %w (%s)", r.Machine, journal.ErrActive, active.ID)
		}
		return put(b, r)
	})
	return r, err
}

// Intent records that step is about to be taken (before the side effect).
func (j *File) Intent(_ context.Context, id string, step int, detail string) error {
	return j.event(id, journal.Entry{Step: step, Kind: journal.EntryIntent, Detail: detail}, "")
}

// Outcome records what step did (after the side effect).
func (j *File) Outcome(_ context.Context, id string, step int, result journal.Result, detail string) error {
	return j.event(id, journal.Entry{Step: step, Kind: journal.EntryOutcome, Result: result, Detail: detail}, "")
}

// Note records something worth knowing that is neither an intent nor an outcome (step -1).
func (j *File) Note(_ context.Context, id string, detail string) error {
	return j.event(id, journal.Entry{Step: -1, Kind: journal.EntryNote, Detail: detail}, "")
}

// Finish ends a remediation and prunes the machine's finished history to the bound.
func (j *File) Finish(_ context.Context, id string, state journal.State, detail string) error {
	if state == journal.InProgress {
		return fmt.Errorf("finish %s: %s is not a final state", id, state)
	}
	return j.event(id, journal.Entry{Step: -1, Kind: journal.EntryNote, Ends: state, Detail: string(state) + ": " + detail}, state)
}

func (j *File) event(id string, e journal.Entry, finish journal.State) error {
	return j.update(func(b *bolt.Bucket) error {
		r, err := get(b, id)
		if err != nil {
			return err
		}
		if r.State != journal.InProgress {
			return fmt.Errorf("remediation %s is %s already: %w", id, r.State, journal.ErrFinished)
		}
		e.At, e.Epoch = j.now(), j.epoch
		r.History = append(r.History, e)
		r.Updated = e.At
		if finish != "" {
			r.State = finish
		}
		if err := put(b, r); err != nil {
			return err
		}
		if finish != "" {
			return prune(b, r.Machine, j.maxDone)
		}
		return nil
	})
}

// Meta reads the JSON value kept under key beside the remediations into v, saying whether there was
// one (the hub keeps its brakes, the raft mark and the last etcd recovery there).
func (j *File) Meta(key string, v any) (bool, error) {
	found := false
	err := j.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta).Get([]byte(key))
		if b == nil {
			return nil
		}
		found = true
		return json.Unmarshal(b, v)
	})
	return found, err
}

// SetMeta keeps v as JSON under key (refused with ErrStaleEpoch once a newer hub took over the file).
func (j *File) SetMeta(key string, v any) error {
	if key == string(keyEpoch) {
		return fmt.Errorf("journal %s: %q is the file's own key", j.path, key)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return j.updateTx(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put([]byte(key), b) })
}

// Active returns every remediation in progress, oldest first: what a restarted hub must resume.
func (j *File) Active(_ context.Context) ([]journal.Remediation, error) {
	return j.list(func(r journal.Remediation) bool { return r.State == journal.InProgress })
}

// Get returns one remediation.
func (j *File) Get(_ context.Context, id string) (journal.Remediation, error) {
	var r journal.Remediation
	err := j.db.View(func(tx *bolt.Tx) error {
		var err error
		r, err = get(tx.Bucket(bucketRems), id)
		return err
	})
	return r, err
}

// All returns every remediation the journal keeps, oldest first.
func (j *File) All(context.Context) ([]journal.Remediation, error) {
	return j.list(func(journal.Remediation) bool { return true })
}

// History returns a machine's remediations, oldest first.
func (j *File) History(_ context.Context, machine string) ([]journal.Remediation, error) {
	return j.list(func(r journal.Remediation) bool { return r.Machine == machine })
}

func (j *File) list(keep func(journal.Remediation) bool) ([]journal.Remediation, error) {
	var out []journal.Remediation
	err := j.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRems).ForEach(func(k, v []byte) error {
			var r journal.Remediation
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("journal %s: record %s is unreadable: %w", j.path, k, err)
			}
			if keep(r) {
				out = append(out, r)
			}
			return nil
		})
	})
	slices.SortFunc(out, func(a, b journal.Remediation) int { return a.Created.Compare(b.Created) })
	return out, err
}

func get(b *bolt.Bucket, id string) (journal.Remediation, error) {
	v := b.Get([]byte(id))
	if v == nil {
		return journal.Remediation{}, fmt.Errorf("%s: %w in the journal", id, journal.ErrNoRemediation)
	}
	var r journal.Remediation
	if err := json.Unmarshal(v, &r); err != nil {
		return journal.Remediation{}, fmt.Errorf("remediation %s is unreadable: %w", id, err)
	}
	return r, nil
}

func put(b *bolt.Bucket, r journal.Remediation) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return b.Put([]byte(r.ID), v)
}

// activeOf returns the machine's remediation in progress, if any. IDs start with "machine/", so only
// the machine's own records are read.
func activeOf(b *bolt.Bucket, machine string) (*journal.Remediation, error) {
	prefix := []byte(machine + "/")
	c := b.Cursor()
	for k, v := c.Seek(prefix); k != nil && strings.HasPrefix(string(k), string(prefix)); k, v = c.Next() {
		var r journal.Remediation
		if err := json.Unmarshal(v, &r); err != nil {
			return nil, fmt.Errorf("remediation %s is unreadable: %w", k, err)
		}
		if r.State == journal.InProgress {
			return &r, nil
		}
	}
	return nil, nil
}

// prune keeps the newest keep finished remediations of a machine (keys sort by time).
func prune(b *bolt.Bucket, machine string, keep int) error {
	prefix := []byte(machine + "/")
	var finished [][]byte
	c := b.Cursor()
	for k, v := c.Seek(prefix); k != nil && strings.HasPrefix(string(k), string(prefix)); k, v = c.Next() {
		var r journal.Remediation
		if json.Unmarshal(v, &r) == nil && r.State != journal.InProgress {
			finished = append(finished, slices.Clone(k))
		}
	}
	for len(finished) > keep {
		if err := b.Delete(finished[0]); err != nil {
			return err
		}
		finished = finished[1:]
	}
	return nil
}
