package boltfile

import (
	"context"
	"fmt"

	"github.com/hale-dev/hale/hub/pass"
)

// What the standalone hub keeps beside the remediations, in the same file: the operator's brakes, the
// raft mark, the last etcd recovery and the episodes' log. Degraded mode in Kubernetes mode keeps one
// too.

// The keys of what the hub keeps beside the remediations.
const (
	keyBrakes   = "brakes"
	keyRaftMark = "raftMark"
	keyRecovery = "recovery"
	keyEpisodes = "episodes"
)

// LoadBrakes returns the operator's brakes as last recorded (none in a new journal).
func (j *File) LoadBrakes(context.Context) (pass.Brakes, error) {
	var b pass.Brakes
	if _, err := j.Meta(keyBrakes, &b); err != nil {
		return pass.Brakes{}, fmt.Errorf("journal %s: the operator's brakes are unreadable: %w (move the file aside to start afresh)", j.Path(), err)
	}
	return b, nil
}

// SaveBrakes records the operator's brakes (refused once a newer hub took over the journal).
func (j *File) SaveBrakes(_ context.Context, b pass.Brakes) error { return j.SetMeta(keyBrakes, b) }

// RaftMark returns the journaled raft mark (none: the zero mark).
func (j *File) RaftMark(context.Context) (pass.RaftMark, error) {
	var m pass.RaftMark
	if _, err := j.Meta(keyRaftMark, &m); err != nil {
		return pass.RaftMark{}, fmt.Errorf("journal %s: the raft mark is unreadable: %w (move the file aside to start afresh)", j.Path(), err)
	}
	return m, nil
}

// RecordRaftMark journals m as the raft mark (only this journal's writer: ErrStaleEpoch otherwise).
func (j *File) RecordRaftMark(_ context.Context, m pass.RaftMark) error {
	return j.SetMeta(keyRaftMark, m)
}

// Recovery returns the journaled recovery (nil: none was ever begun). It stays recorded once done
// (Done set), until the next one is begun.
func (j *File) Recovery(context.Context) (*pass.RecoveryRecord, error) {
	var r pass.RecoveryRecord
	found, err := j.Meta(keyRecovery, &r)
	if err != nil {
		return nil, fmt.Errorf("journal %s: the recovery record is unreadable: %w", j.Path(), err)
	}
	if !found {
		return nil, nil
	}
	return &r, nil
}

// RecordRecovery journals r as the recovery (only this journal's writer: ErrStaleEpoch otherwise).
func (j *File) RecordRecovery(_ context.Context, r pass.RecoveryRecord) error {
	return j.SetMeta(keyRecovery, r)
}

// Episodes returns the journaled episodes' log (none in a new journal).
func (j *File) Episodes(context.Context) (pass.EpisodeLog, error) {
	var l pass.EpisodeLog
	if _, err := j.Meta(keyEpisodes, &l); err != nil {
		return nil, fmt.Errorf("journal %s: the episodes' log is unreadable: %w (move the file aside to start afresh)", j.Path(), err)
	}
	return l, nil
}

// RecordEpisodes journals the episodes' log (only this journal's writer: ErrStaleEpoch otherwise).
func (j *File) RecordEpisodes(_ context.Context, l pass.EpisodeLog) error {
	return j.SetMeta(keyEpisodes, l)
}
