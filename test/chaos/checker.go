package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hale-dev/hale/test/lab"
	"github.com/hale-dev/hale/test/netns"
	"github.com/hale-dev/hale/test/proc"
)

// The checker trusts nothing the hub says about itself. It samples every etcd member directly (from
// the out-of-band host, over etcd's JSON gateway), reads every process's state from /proc, reads the
// namespaces' iptables rules as the lab changes them, one by one, and takes the power actions from the BMC
// simulators (the power changes they made to the machines, the requests they got). Only property 5
// reads the hub's status, to see that a machine it holds is held with a reason.

// memberSample is one etcd member as the checker saw it at one moment.
type memberSample struct {
	// Up: the member's process exists and is not stopped; AgentUp likewise for the machine's agent.
	Up, AgentUp bool
	// OK: it answered its status. ID, Leader, Term: its own member ID, its leader, its raft term;
	// Cluster its etcd cluster's ID.
	OK                        bool
	ID, Leader, Term, Cluster uint64
	Learner                   bool
}

// sample is the cluster at one moment.
type sample struct {
	At      time.Time
	Members []memberSample
	// Voters is the voting members in the last member list read.
	Voters int
	// Heard counts the expected observers the hub can hear (by the processes and the rules: itself,
	// and every agent that runs and whose host's link to the hub's is not cut either way); Expected is
	// their number (agents, witnesses, the hub).
	Heard, Expected int
	HubUp           bool
	// CutFromHub: the rules drop everything between the hub's host and the machine's, one way or both.
	CutFromHub []bool
	// HubRead: the hub's status was read within the last 1.5 s (property 6, the hub's own word);
	// ForGood: it said etcd's quorum is lost for good.
	HubRead, ForGood bool
}

// healthy says which members are healthy voters: up, answering, a voter, following the leader that
// the leader itself reports, in its term.
func (s sample) healthy() []bool {
	out := make([]bool, len(s.Members))
	for _, l := range s.Members {
		if !l.Up || !l.OK || l.Leader == 0 || l.Leader != l.ID {
			continue
		}
		for i, m := range s.Members {
			out[i] = m.Up && m.OK && !m.Learner && m.Leader == l.ID && m.Term == l.Term
		}
	}
	return out
}

func (s sample) healthyCount() int {
	n := 0
	for _, h := range s.healthy() {
		if h {
			n++
		}
	}
	return n
}

func (s sample) quorum() int { return s.Voters/2 + 1 }

func (s sample) majority() bool { return 2*s.Heard > s.Expected }

// checker samples the cluster every 200 ms.
type checker struct {
	c      *lab.Cluster
	tl     *timeline
	client *http.Client

	mu      sync.Mutex
	samples []sample
	voters  int
	blocked map[[2]string]bool // host IP pairs (from, to) whose packets are all dropped
	rules   map[ruleKey]int    // the DROP rules standing, and how many times each
	// cutFromHub names the hosts whose link to the hub's drops everything, one way or both.
	cutFromHub []string
	// forGood is the hub's latest word on a permanent loss, and when it was read (runHub); planning,
	// whether its latest pass planned (it heard a majority of its observers, among other things).
	forGood, planning bool
	forGoodAt         time.Time
}

func newChecker(c *lab.Cluster, tl *timeline) *checker {
	chk := &checker{c: c, tl: tl, voters: len(c.Machines), blocked: map[[2]string]bool{}, rules: map[ruleKey]int{}}
	c.Lab.OnRule(chk.rule)
	chk.client = &http.Client{Timeout: 400 * time.Millisecond, Transport: &http.Transport{DialContext: c.OOB.Dial, DisableKeepAlives: true}}
	return chk
}

// rule follows one iptables rule the lab applied in h, as it applied it: the links whose packets are all
// dropped (loss rules, with a probability, and a host's isolation do not count). A partition's rules
// once went in one at a time, seconds apart on a loaded machine (now each host's at once, side by
// side, still a moment apart on a loaded one); reading them once a cut was whole saw a second
// cut's first rules at the same moment as the first cut's last, and judged a hub that had acted on the
// first cut with a majority (the far side's trade-off) as one that had heard no majority (seed 1
// beside load, 3 runs in 4, 2026-12-04). The same rule may stand twice (two overlapping cuts): each
// -A or -I counts, each -D takes one away, -F empties the chain.
func (chk *checker) rule(h *netns.Host, args []string) {
	if len(args) < 2 {
		return
	}
	action, chain := args[0], args[1]
	chk.mu.Lock()
	defer chk.mu.Unlock()
	if action == "-F" {
		for k := range chk.rules {
			if k.host == h.IP && k.chain == chain {
				delete(chk.rules, k)
			}
		}
	} else if peer := droppedPeer(args); peer != "" {
		k := ruleKey{host: h.IP, chain: chain, peer: peer}
		switch action {
		case "-A", "-I":
			chk.rules[k]++
		case "-D":
			if chk.rules[k]--; chk.rules[k] <= 0 {
				delete(chk.rules, k)
			}
		}
	}
	chk.blocked = map[[2]string]bool{}
	for k := range chk.rules {
		if k.chain == "OUTPUT" {
			chk.blocked[[2]string{k.host, k.peer}] = true
		} else {
			chk.blocked[[2]string{k.peer, k.host}] = true
		}
	}
	// The timeline says when the hub's links change (run.log: what a failed run's reader needs first).
	var cut []string
	for _, o := range append(machineHosts(chk.c), chk.c.Witnesses...) {
		if chk.cutFromHubLocked(o) {
			cut = append(cut, o.Name)
		}
	}
	if !slices.Equal(cut, chk.cutFromHub) {
		chk.cutFromHub = cut
		chk.tl.add("net", "hub", "cut from: "+cmp.Or(strings.Join(cut, ", "), "none"))
	}
}

// cutFromHubLocked: the rules drop everything between h and the hub's host, one way or both (chk.mu
// held).
func (chk *checker) cutFromHubLocked(h *netns.Host) bool {
	hub := chk.c.HubHost.IP
	return chk.blocked[[2]string{h.IP, hub}] || chk.blocked[[2]string{hub, h.IP}]
}

func machineHosts(c *lab.Cluster) []*netns.Host {
	var out []*netns.Host
	for _, m := range c.Machines {
		out = append(out, m.Host)
	}
	return out
}

// ruleKey is one DROP rule: in host's chain (INPUT or OUTPUT), for the packets from (INPUT) or to
// (OUTPUT) peer.
type ruleKey struct{ host, chain, peer string }

// droppedPeer is the address a rule drops everything from (-s) or to (-d), "" for any other rule.
func droppedPeer(args []string) string {
	if slices.Contains(args, "statistic") || len(args) < 2 || args[len(args)-1] != "DROP" || args[len(args)-2] != "-j" {
		return ""
	}
	for i := 2; i+1 < len(args); i++ {
		if (args[1] == "INPUT" && args[i] == "-s") || (args[1] == "OUTPUT" && args[i] == "-d") {
			return strings.TrimSuffix(args[i+1], "/32")
		}
	}
	return ""
}

// runHub reads the hub's status every second until ctx ends: whether it says etcd's quorum is lost
// for good (property 6). Apart from the samples, which a slow answer must not hold up.
func (chk *checker) runHub(ctx context.Context) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := chk.c.Status(rctx)
		cancel()
		if err == nil {
			chk.mu.Lock()
			chk.forGood, chk.forGoodAt = st.QuorumLoss != nil && st.QuorumLoss.ForGood, time.Now()
			chk.planning = st.NotPlanning == ""
			chk.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// run samples until ctx ends.
func (chk *checker) run(ctx context.Context) {
	go chk.runHub(ctx)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s := chk.sample(ctx, n%5 == 0)
		chk.mu.Lock()
		chk.samples = append(chk.samples, s)
		chk.mu.Unlock()
		n++
	}
}

func (chk *checker) sample(ctx context.Context, members bool) sample {
	c := chk.c
	s := sample{At: time.Now(), Members: make([]memberSample, len(c.Machines))}
	var wg sync.WaitGroup
	for i, m := range c.Machines {
		etcd, agent, on := m.Procs()
		s.Members[i].Up, s.Members[i].AgentUp = on && running(etcd), on && running(agent)
		wg.Add(1)
		go func() {
			defer wg.Done()
			chk.status(ctx, m.Host.Addr(2379), &s.Members[i])
		}()
	}
	wg.Wait()
	if members {
		for _, m := range c.Machines {
			if v, err := chk.voterCount(ctx, m.Host.Addr(2379)); err == nil {
				chk.mu.Lock()
				if v != chk.voters {
					chk.tl.add("membership", "", fmt.Sprintf("%d voters (were %d)", v, chk.voters))
				}
				chk.voters = v
				chk.mu.Unlock()
				break
			}
		}
	}
	hub := c.HubProc()
	s.HubUp = running(hub)
	s.Expected = len(c.Machines) + len(c.Witnesses) + 1
	chk.mu.Lock()
	defer chk.mu.Unlock()
	s.Voters = chk.voters
	hears := func(h *netns.Host) bool { return !chk.cutFromHubLocked(h) }
	s.CutFromHub = make([]bool, len(c.Machines))
	for i, m := range c.Machines {
		s.CutFromHub[i] = !hears(m.Host)
	}
	if s.At.Sub(chk.forGoodAt) < 1500*time.Millisecond {
		s.HubRead, s.ForGood = true, chk.forGood
	}
	if !s.HubUp {
		return s
	}
	s.Heard = 1
	for i := range c.Machines {
		if s.Members[i].AgentUp && !s.CutFromHub[i] {
			s.Heard++
		}
	}
	for _, h := range c.Witnesses {
		if running(c.Witness(h.Name)) && hears(h) {
			s.Heard++
		}
	}
	return s
}

// running reads the process's state from /proc: it exists and is not stopped.
func running(p *proc.Process) bool {
	if p == nil || !p.Running() {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st != 'T' && st != 't' && st != 'Z'
}

// status reads one member's status through etcd's JSON gateway.
func (chk *checker) status(ctx context.Context, addr string, into *memberSample) {
	var st struct {
		Header struct {
			MemberID  string `json:"member_id"`
			ClusterID string `json:"cluster_id"`
		} `json:"header"`
		Leader    string `json:"leader"`
		RaftTerm  string `json:"raftTerm"`
		IsLearner bool   `json:"isLearner"`
	}
	if err := chk.post(ctx, addr, "/v3/maintenance/status", &st); err != nil {
		return
	}
	into.OK = true
	into.ID, _ = strconv.ParseUint(st.Header.MemberID, 10, 64)
	into.Cluster, _ = strconv.ParseUint(st.Header.ClusterID, 10, 64)
	into.Leader, _ = strconv.ParseUint(st.Leader, 10, 64)
	into.Term, _ = strconv.ParseUint(st.RaftTerm, 10, 64)
	into.Learner = st.IsLearner
}

func (chk *checker) voterCount(ctx context.Context, addr string) (int, error) {
	var list struct {
		Members []struct {
			IsLearner bool `json:"isLearner"`
		} `json:"members"`
	}
	if err := chk.post(ctx, addr, "/v3/cluster/member/list", &list); err != nil {
		return 0, err
	}
	n := 0
	for _, m := range list.Members {
		if !m.IsLearner {
			n++
		}
	}
	return n, nil
}

func (chk *checker) post(ctx context.Context, addr, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, strings.NewReader("{}"))
	if err != nil {
		return err
	}
	resp, err := chk.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s%s: %s", addr, path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

func (chk *checker) all() []sample {
	chk.mu.Lock()
	defer chk.mu.Unlock()
	return append([]sample(nil), chk.samples...)
}

// allHealthy: every member a healthy voter, every agent up, the full membership, the hub up.
func (s sample) allHealthy() bool {
	if !s.HubUp || s.Voters != len(s.Members) {
		return false
	}
	for i, h := range s.healthy() {
		if !h || !s.Members[i].AgentUp {
			return false
		}
	}
	return true
}

// latest is the newest sample.
func (chk *checker) latest() (sample, bool) {
	chk.mu.Lock()
	defer chk.mu.Unlock()
	if len(chk.samples) == 0 {
		return sample{}, false
	}
	return chk.samples[len(chk.samples)-1], true
}
