package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// Annotations on the HealthPolicy where every leader finds what the hub journals outside Remediations:
// the last etcd recovery (a hub.RecoveryRecord as JSON) and the raft mark (a hub.RaftMark as JSON).
const (
	RecoveryAnnotation = "hale.dev/etcd-recovery"
	MarkAnnotation     = "hale.dev/raft-mark"
	// EpisodesAnnotation keeps the episodes' log (a pass.EpisodeLog as JSON, the newest
	// maxPolicyEpisodes): `hub explain` lists a machine's.
	EpisodesAnnotation = "hale.dev/episodes"
)

// maxPolicyEpisodes bounds the episodes kept in the HealthPolicy's annotation (an object's annotations
// hold 256 KiB in all; an episode is ~300 bytes).
const maxPolicyEpisodes = 100

// PolicyRecoveries keeps the last etcd recovery in the HealthPolicy (RecoveryAnnotation), where every
// leader finds it: the old cluster's members it retired stay held until they rejoin (hub/retired.go),
// also after the degraded term that carried the recovery out has been imported and its local journal
// removed.
type PolicyRecoveries struct {
	Client client.Client
	Policy client.ObjectKey
}

// Recovery reads the last recovery (nil: none, or no policy yet).
func (pr PolicyRecoveries) Recovery(ctx context.Context) (*pass.RecoveryRecord, error) {
	var r pass.RecoveryRecord
	ok, err := readAnnotation(ctx, pr.Client, pr.Policy, RecoveryAnnotation, &r,
		"it is Hale's record of the last etcd recovery: restore it, or remove it to forget that recovery")
	if !ok || err != nil {
		return nil, err
	}
	return &r, nil
}

// RecordRecovery writes r as the last recovery (creating the policy when missing).
func (pr PolicyRecoveries) RecordRecovery(ctx context.Context, r pass.RecoveryRecord) error {
	if err := writeAnnotation(ctx, pr.Client, pr.Policy, RecoveryAnnotation, r); err != nil {
		return fmt.Errorf("recording etcd recovery %s: %w", r.Plan.Token, err)
	}
	return nil
}

// PolicyMarks keeps the raft mark in the HealthPolicy (MarkAnnotation): what `hub recover` checks a
// survivor against, and what a new leader compares the cluster's ID with (a cluster rebuilt meanwhile
// retires the members it left out).
type PolicyMarks struct {
	Client client.Client
	Policy client.ObjectKey
}

// RaftMark reads the mark (the zero mark: none, or no policy yet).
func (pm PolicyMarks) RaftMark(ctx context.Context) (pass.RaftMark, error) {
	var m pass.RaftMark
	_, err := readAnnotation(ctx, pm.Client, pm.Policy, MarkAnnotation, &m, "it is Hale's raft mark: remove it, and the hub starts it again from the reports")
	return m, err
}

// RecordRaftMark writes the mark (creating the policy when missing).
func (pm PolicyMarks) RecordRaftMark(ctx context.Context, m pass.RaftMark) error {
	if err := writeAnnotation(ctx, pm.Client, pm.Policy, MarkAnnotation, m); err != nil {
		return fmt.Errorf("recording the raft mark: %w", err)
	}
	return nil
}

// PolicyEpisodes keeps the episodes' log in the HealthPolicy (EpisodesAnnotation), where every leader
// finds it.
type PolicyEpisodes struct {
	Client client.Client
	Policy client.ObjectKey
}

// Episodes reads the log (none: no annotation, or no policy yet).
func (pe PolicyEpisodes) Episodes(ctx context.Context) (pass.EpisodeLog, error) {
	var l pass.EpisodeLog
	_, err := readAnnotation(ctx, pe.Client, pe.Policy, EpisodesAnnotation, &l, "it is Hale's log of each machine's last episodes: remove it to start it afresh")
	return l, err
}

// RecordEpisodes writes the log, its newest maxPolicyEpisodes (creating the policy when missing).
func (pe PolicyEpisodes) RecordEpisodes(ctx context.Context, l pass.EpisodeLog) error {
	var all []pass.Episode
	for _, eps := range l {
		all = append(all, eps...)
	}
	if len(all) > maxPolicyEpisodes {
		slices.SortFunc(all, func(a, b pass.Episode) int { return b.Ended.Compare(a.Ended) })
		cut := all[maxPolicyEpisodes-1].Ended
		trimmed := pass.EpisodeLog{}
		for m, eps := range l {
			for _, e := range eps {
				if !e.Ended.Before(cut) {
					trimmed[m] = append(trimmed[m], e)
				}
			}
		}
		l = trimmed
	}
	if err := writeAnnotation(ctx, pe.Client, pe.Policy, EpisodesAnnotation, l); err != nil {
		return fmt.Errorf("recording the episodes' log: %w", err)
	}
	return nil
}

// readAnnotation reads the policy's annotation key as JSON into v; ok is false when there is none (or
// no policy). A broken one is an error that says what it is (what).
func readAnnotation(ctx context.Context, c client.Client, policy client.ObjectKey, key string, v any, what string) (bool, error) {
	var p v1alpha1.HealthPolicy
	err := c.Get(ctx, policy, &p)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading HealthPolicy %s: %w", policy, err)
	}
	s, ok := p.Annotations[key]
	if !ok {
		return false, nil
	}
	if err := json.Unmarshal([]byte(s), v); err != nil {
		return false, fmt.Errorf("HealthPolicy %s: annotation %s: %w (%s)", policy, key, err, what)
	}
	return true, nil
}

// writeAnnotation writes v as JSON into the policy's annotation key (a merge patch; the policy made
// when missing).
func writeAnnotation(ctx context.Context, c client.Client, policy client.ObjectKey, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: string(b)}}})
	if err != nil {
		return err
	}
	p := &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: policy.Namespace, Name: policy.Name}}
	err = c.Patch(ctx, p, client.RawPatch(types.MergePatchType, patch))
	if apierrors.IsNotFound(err) {
		p.Annotations = map[string]string{key: string(b)}
		if err = c.Create(ctx, p); apierrors.IsAlreadyExists(err) { // made meanwhile
			err = c.Patch(ctx, p, client.RawPatch(types.MergePatchType, patch))
		}
	}
	if err != nil {
		return fmt.Errorf("HealthPolicy %s: %w", policy, err)
	}
	return nil
}

// ImportRecovery writes back a recovery that a degraded term journaled locally while the API server
// did not answer: the record into store (the HealthPolicy) and a Remediation per fenced member
// (strategy fence, its fence as its history; note says where it was recorded). It returns the notices
// to say (through the hub's one event path: Hub.Say): one per fenced machine and one for the
// recovery, to be said once the whole import succeeded. Imported again (an import cut short, whose
// notices were not said), nothing is written twice and every notice is returned again.
func ImportRecovery(ctx context.Context, j *Journal, store hub.RecoveryStore, rec pass.RecoveryRecord, note string) ([]pass.Notice, error) {
	if store != nil {
		if err := store.RecordRecovery(ctx, rec); err != nil {
			return nil, err
		}
	}
	p := rec.Plan
	var fenced []string
	var said []pass.Notice
	for _, f := range p.Fence {
		if f.Machine == "" {
			continue
		}
		state := journal.Succeeded
		if !f.Fenced {
			state = journal.Aborted
		}
		r := journal.Remediation{Machine: f.Machine, Strategy: quorum.Fence.String(), RequestedBy: rec.By, State: state, Attempt: 1,
			Reason:  fmt.Sprintf("etcd recovery %s: %s lost for good, fenced before etcd was rebuilt from %s", p.Token, f.Member, survivorOf(p)),
			Steps:   []quorum.Step{{Op: quorum.OpPowerOff, Member: f.Member}},
			Created: rec.Began, Updated: rec.Began,
			History: []journal.Entry{{At: rec.Began, Step: 0, Kind: journal.EntryOutcome, Result: journal.ResultDone, Detail: f.How}}}
		if !f.Fenced {
			r.History[0].Result, r.History[0].Detail = journal.ResultFailed, "not fenced when the term ended: "+f.How
		}
		if err := j.Import(ctx, r, note); err != nil {
			return nil, fmt.Errorf("importing the fence of %s by etcd recovery %s: %w", f.Machine, p.Token, err)
		}
		fenced = append(fenced, fmt.Sprintf("%s (%s)", f.Machine, f.Member))
		said = append(said, pass.Notice{Machine: f.Machine, Reason: pass.ReasonEtcdRecovery, Warning: true,
			Message: fmt.Sprintf("%s: fenced by etcd recovery %s (%s): %s", f.Machine, p.Token, state, f.How)})
	}
	done := "under way: the survivor had not yet answered as a new cluster"
	if rec.Done != nil {
		done = "done: etcd cluster " + rec.NewClusterID
	}
	return append(said, pass.Notice{Reason: pass.ReasonEtcdRecovery, Warning: true,
		Message: fmt.Sprintf("etcd recovery %s by %s, begun %s while the API server did not answer: rebuilt from %s, fenced %s; %s",
			p.Token, rec.By, rec.Began.UTC().Format("2006-01-02T15:04:05Z"), survivorOf(p), strings.Join(fenced, ", "), done)}), nil
}

func survivorOf(p pass.RecoveryPlan) string {
	if s := p.Survivor; s != nil {
		return fmt.Sprintf("%s (%s)", s.Member, s.Machine)
	}
	return "its survivor"
}
