package recovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// AddLearner adds a member back to the rebuilt cluster as a learner (it votes only once promoted, so
// a member that never catches up costs no quorum) and returns the --initial-cluster its etcd starts
// with, on an empty data directory and --initial-cluster-state=existing. etcd refuses a new member
// until every voter has been connected for a few seconds (a voter just promoted): it tries again until
// timeout. A member already added with that peer URL (an earlier try that timed out) is kept.
func AddLearner(ctx context.Context, cli *clientv3.Client, name, peerURL string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		ml, err := cli.MemberList(ctx)
		if err == nil {
			if m := memberWithPeerURL(ml.Members, peerURL); m != nil {
				return initialCluster(ml.Members, m.ID, name), nil
			}
			var resp *clientv3.MemberAddResponse
			if resp, err = cli.MemberAddAsLearner(ctx, []string{peerURL}); err == nil {
				return initialCluster(resp.Members, resp.Member.ID, name), nil
			}
		}
		if !errors.Is(err, rpctypes.ErrUnhealthy) || time.Now().After(deadline) {
			return "", fmt.Errorf("adding %s (%s) as a learner: %w", name, peerURL, err)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return "", err
		}
	}
}

func memberWithPeerURL(ms []*etcdserverpb.Member, peerURL string) *etcdserverpb.Member {
	for _, m := range ms {
		if slices.Contains(m.PeerURLs, peerURL) {
			return m
		}
	}
	return nil
}

// initialCluster is the --initial-cluster of the new member id, named name (not started yet, etcd
// knows it by its peer URL only).
func initialCluster(ms []*etcdserverpb.Member, id uint64, name string) string {
	var initial []string
	for _, m := range ms {
		n := m.Name
		if m.ID == id {
			n = name
		}
		for _, u := range m.PeerURLs {
			initial = append(initial, n+"="+u)
		}
	}
	sort.Strings(initial)
	return strings.Join(initial, ",")
}

// Promote makes the learner name a voter once etcd allows it (the learner has caught up with the
// leader), trying until timeout.
func Promote(ctx context.Context, cli *clientv3.Client, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ml, err := cli.MemberList(ctx)
		if err != nil {
			last = err
		} else {
			found := false
			for _, m := range ml.Members {
				if m.Name != name {
					continue
				}
				found = true
				if !m.IsLearner {
					return nil
				}
				if _, err := cli.MemberPromote(ctx, m.ID); err == nil {
					return nil
				} else {
					last = err // "can only promote a learner member which is in sync with leader": wait
				}
			}
			if !found {
				last = fmt.Errorf("no started member named %s yet", name)
			}
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("promoting %s: not done within %s (last: %w)", name, timeout, last)
}
