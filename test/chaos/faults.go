package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/test/lab"
	"github.com/hale-dev/hale/test/netns"
	"github.com/hale-dev/hale/test/proc"
)

// fault is one fault of a schedule: what, on whom, from At for For (into the run).
type fault struct {
	At, For time.Duration
	Kind    string
	// A and B are the hosts it concerns (a partition's two sides; a link's two ends; one target in A).
	A, B []string
	// P is a loss probability; Force marks a forced manual reboot.
	P     float64
	Force bool
}

func (f fault) String() string {
	s := f.Kind
	if len(f.A) > 0 {
		s += " " + strings.Join(f.A, ",")
	}
	if len(f.B) > 0 {
		s += " | " + strings.Join(f.B, ",")
	}
	if f.P > 0 {
		s += fmt.Sprintf(" p=%.2f", f.P)
	}
	if f.Force {
		s += " --force"
	}
	return s
}

// schedule is a run's faults, then a quiet period in which every fault has been undone.
type schedule struct {
	Name     string
	Seed     uint64
	Duration time.Duration
	Faults   []fault
	// Policy is added to the inventory's policy (flow style, e.g. "comeBackTimeout: 15s").
	Policy string
	// Spare are machines no fault of the schedule makes sick: Hale must never power them off
	// (property 2), whatever stale evidence a partition left behind when it healed.
	Spare []string
	// StaticPods runs each machine's etcd from a static pod manifest (lab.Options.StaticPods), for
	// `agent recover` and `agent rejoin`; HubArgs are added to `hub run`'s arguments.
	StaticPods bool
	HubArgs    []string
}

// Fault kinds.
const (
	killEtcd    = "kill-etcd"    // SIGKILL a member; it stays down until its machine is power-cycled
	stopEtcd    = "stop-etcd"    // SIGSTOP a member for For
	killAgent   = "kill-agent"   // SIGKILL an agent; restarted after For (as the kubelet would)
	stopAgent   = "stop-agent"   // SIGSTOP an agent for For
	killHub     = "kill-hub"     // SIGKILL the hub; restarted after For (as its Deployment would)
	stopHub     = "stop-hub"     // SIGSTOP the hub for For
	killHubStep = "kill-hub-bmc" // SIGKILL the hub as the next BMC power action takes a machine down (within For)
	partition   = "partition"    // cut A from B, both ways
	oneWay      = "one-way"      // drop packets from A to B
	flap        = "flap"         // cut A from B, uncut, cut… every 1-2 s
	loss        = "loss"         // drop packets between A and B both ways with probability P
	bmcNet      = "bmc-net"      // cut the hub from the BMCs
	bmcSlow     = "bmc-slow"     // Redfish answers take 3 s
	bmc500      = "bmc-500"      // Redfish answers 500 to the next 4 requests
	bmcAuth     = "bmc-auth"     // Redfish rejects the credentials
	bmcIgnore   = "bmc-ignore"   // Redfish accepts resets and does nothing
	ipmiStop    = "ipmi-stop"    // ipmi_sim stopped (no answers)
	opPause     = "pause"        // hub pause --wait; resume after For
	opSuspend   = "suspend"      // hub suspend; unsuspend after For
	opDetach    = "detach"       // hub detach A; attach after For
	opReboot    = "reboot"       // hub reboot A [--force --yes]
	// opRecover is `hub recover --yes` with no machine confirmed lost: what an operator who believes
	// the hub's "lost" would run. While a quorum of members holds (on the far side of a partition, say),
	// the hub must refuse it and fence nothing (the checker's property 6).
	opRecover = "recover"
	// forge runs, on host B, an agent that gives A's name: the pool key and a copy of A's config, but
	// an identity key of its own (it does not have A's), its etcd probe failing: the reports that
	// would make A look failed.
	forge = "forge"
	// rekey rotates A's identity key as docs/identities.md says: its new key pinned beside the old,
	// every member given time to read the file, A's agent restarted on the new key, the old line
	// dropped. Nobody may see A dead for it, and Hale must not act on A.
	rekey = "rekey"
	// lose kills the machines in A for good: their power supplies fail (their BMCs read them Off and
	// cannot power them on) and their disks with their etcd data. Not undone: only recoverAll brings
	// them back.
	lose = "lose"
	// opRecoverAll is the operator's whole recovery after a permanent loss, as docs/operating.md has it
	// (recoverAll), within For.
	opRecoverAll = "recover-all"
	// rogue power-cycles A through its BMC behind the hub's back (hub bmc power cycle): what a Hale
	// that ignored quorum would do. Only the checker's self-test uses it: the checker must object.
	rogue = "rogue-cycle"
)

// weights of the fault kinds a seed draws from.
var kindWeights = []struct {
	kind   string
	weight int
}{
	{killEtcd, 8}, {stopEtcd, 5}, {killAgent, 5}, {stopAgent, 3}, {killHub, 4}, {stopHub, 2}, {killHubStep, 3},
	{partition, 10}, {oneWay, 4}, {flap, 3}, {loss, 3}, {bmcNet, 2},
	{bmcSlow, 2}, {bmc500, 2}, {bmcAuth, 2}, {bmcIgnore, 2}, {ipmiStop, 2},
	{opPause, 3}, {opSuspend, 2}, {opDetach, 3}, {opReboot, 3}, {forge, 2}, {rekey, 1},
}

// generate draws a schedule of faults over d from seed: one begins every 2-12 s, lasting 3-20 s
// (so a few overlap), each of them over by d.
func generate(seed uint64, d time.Duration, sh lab.Shape) schedule {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	total := 0
	for _, kw := range kindWeights {
		total += kw.weight
	}
	machines := names("cp-", sh.Machines)
	agents := append(slices.Clone(machines), names("w-", sh.Witnesses)...)
	hosts := append(slices.Clone(agents), "hub")
	pick := func(from []string) string { return from[rng.IntN(len(from))] }
	s := schedule{Name: fmt.Sprintf("seed %d", seed), Seed: seed, Duration: d}
	for at := 5 * time.Second; ; at += time.Duration(2000+rng.IntN(10000)) * time.Millisecond {
		f := fault{At: at, For: time.Duration(3000+rng.IntN(17000)) * time.Millisecond}
		if at+f.For > d {
			break
		}
		n := rng.IntN(total)
		for _, kw := range kindWeights {
			if n < kw.weight {
				f.Kind = kw.kind
				break
			}
			n -= kw.weight
		}
		switch f.Kind {
		case killEtcd, stopEtcd, opDetach:
			f.A = []string{pick(machines)}
		case opReboot:
			f.A, f.Force = []string{pick(machines)}, rng.IntN(3) == 0
		case forge:
			f.A, f.B = []string{pick(append(slices.Clone(agents), "cp-9"))}, []string{pick(hosts)}
		case killAgent, stopAgent, rekey:
			f.A = []string{pick(agents)}
		case partition:
			f.A, f.B = split(rng, hosts)
		case oneWay, flap:
			a := pick(hosts)
			f.A, f.B = []string{a}, []string{pick(without(hosts, a))}
		case loss:
			a := pick(hosts)
			f.A, f.B, f.P = []string{a}, []string{pick(without(hosts, a))}, 0.1+0.4*rng.Float64()
		}
		s.Faults = append(s.Faults, f)
	}
	return s
}

// split draws a partition's sides: the hub alone, the hub with a minority, or a random minority.
func split(rng *rand.Rand, hosts []string) (a, b []string) {
	others := without(hosts, "hub")
	shuffled := slices.Clone(others)
	rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	switch rng.IntN(3) {
	case 0: // the hub isolated
		a = []string{"hub"}
	case 1: // the hub with a minority
		a = append([]string{"hub"}, shuffled[:1+rng.IntN((len(hosts)-1)/2)]...)
	default: // a minority of the others, the hub on the majority's side
		a = shuffled[:1+rng.IntN((len(hosts)-1)/2)]
	}
	for _, h := range hosts {
		if !slices.Contains(a, h) {
			b = append(b, h)
		}
	}
	return a, b
}

func names(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s%d", prefix, i))
	}
	return out
}

func without(list []string, x string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(s string) bool { return s == x })
}

// named are the schedules worth keeping by name.
var named = map[string]func(d time.Duration) schedule{
	// The case that found the partition bug: the hub and one agent cut off from the rest (two healthy
	// machines and the witnesses) for most of the run. The hub hears a minority and must do nothing,
	// not even when the operator runs `hub recover --yes` late in the partition.
	"minority-hub": func(d time.Duration) schedule {
		return schedule{Name: "minority-hub", Duration: d, Spare: []string{"cp-0", "cp-1", "cp-2"}, Faults: []fault{
			{At: 5 * time.Second, For: d - 10*time.Second, Kind: partition, A: []string{"hub", "cp-0"}, B: []string{"cp-1", "cp-2", "w-0", "w-1"}},
			{At: d - 15*time.Second, Kind: opRecover},
		}}
	},
	// The far side of a partition holds etcd's quorum (cp-1, cp-2); the hub, both witnesses and cp-0
	// are on this side with the BMC network. The hub hears 4 of 6 observers and sees two members dead:
	// it may power-cycle each once (from here, a double crash looks the same), but not again while
	// nobody sees it (DESIGN rule 9; the checker's property 2), and after the heal it touches nothing
	// on its own side (cp-0's "no leader" is stale evidence then: TestChaos checks it). Late in the
	// partition the operator runs `hub recover --yes`: refused, since cp-1 and cp-2 read powered on
	// and nobody confirmed them lost by name (the checker's property 6). A short
	// comeBackTimeout makes several cooldowns fit in the partition.
	"far-side": func(d time.Duration) schedule {
		return schedule{Name: "far-side", Duration: d, Policy: "comeBackTimeout: 15s", Spare: []string{"cp-0"}, Faults: []fault{
			{At: 5 * time.Second, For: d - 10*time.Second, Kind: partition, A: []string{"hub", "cp-0", "w-0", "w-1"}, B: []string{"cp-1", "cp-2"}},
			{At: d - 15*time.Second, Kind: opRecover},
		}}
	},
	// A holder of the pool key speaks for cp-1 (forged reports of a failing etcd) before, during and after
	// a restart of cp-1's agent, and for cp-9, a name that is not pinned; then cp-1's etcd really dies
	// while the forger still runs. Not one forged report may count: cp-1 is power-cycled once, for its
	// real death, and nothing else (TestChaos checks the hub's reject counts too).
	"forger": func(d time.Duration) schedule {
		return schedule{Name: "forger", Duration: d, Spare: []string{"cp-0", "cp-2"}, Faults: []fault{
			{At: 5 * time.Second, For: d - 10*time.Second, Kind: forge, A: []string{"cp-1"}, B: []string{"w-1"}},
			{At: 5 * time.Second, For: d - 10*time.Second, Kind: forge, A: []string{"cp-9"}, B: []string{"hub"}},
			{At: 12 * time.Second, For: 8 * time.Second, Kind: killAgent, A: []string{"cp-1"}},
			{At: 22 * time.Second, Kind: rekey, A: []string{"cp-0"}},
			{At: 35 * time.Second, Kind: killEtcd, A: []string{"cp-1"}},
		}}
	},
	// cp-0 and cp-1 die for good (power supplies and disks): their BMCs read them Off and cannot power
	// them on, and the hub says quorum is lost for good. The operator recovers as the runbook says,
	// from cp-2 (recoverAll), the hub killed in the middle of it. The lab's etcd runs from static pods
	// for `agent recover`; the hub's power-ons that cannot come on fail after 10 s, not 60, and
	// `hub recover --yes` waits for one in flight. Hale must never power cp-2 off (the survivor), two
	// etcd clusters must never serve at once (property 7), and at the end all three are healthy
	// members of the rebuilt cluster.
	"permanent-loss": func(d time.Duration) schedule {
		return schedule{Name: "permanent-loss", Duration: d, Spare: []string{"cp-2"}, StaticPods: true,
			HubArgs: []string{"--bmc-verify-timeout", "10s"}, Faults: []fault{
				{At: 5 * time.Second, Kind: lose, A: []string{"cp-0", "cp-1"}},
				{At: 6 * time.Second, For: d - 11*time.Second, Kind: opRecoverAll},
				{At: 10 * time.Second, For: 3 * time.Second, Kind: killHub},
			}}
	},
	// A member dies and the hub is killed the moment its BMC takes the machine down: the restarted hub
	// finishes the remediation without a second power action.
	"hub-dies-in-step": func(d time.Duration) schedule {
		return schedule{Name: "hub-dies-in-step", Duration: d, Faults: []fault{
			{At: 3 * time.Second, For: 40 * time.Second, Kind: killHubStep},
			{At: 5 * time.Second, Kind: killEtcd, A: []string{"cp-1"}},
		}}
	},
}

// selfTest is the checker's own test: a healthy voter power-cycled behind the hub's back, which the
// checker must report as Hale's (property 2), and nothing else. Twice, more than a cooldown apart: the checker
// calls a voter healthy only on every sample of the 2 s before, and on a loaded machine (a full test
// run) one sample there once showed the cluster between leaders, so that the one cycle went unreported.
func selfTest(d time.Duration) schedule {
	return schedule{Name: "checker-selftest", Duration: d, Faults: []fault{
		{At: 5 * time.Second, For: 3 * time.Second, Kind: rogue, A: []string{"cp-1"}},
		{At: 10*time.Second + lab.Cooldown, For: 3 * time.Second, Kind: rogue, A: []string{"cp-1"}},
	}}
}

// injector applies a schedule's faults to a cluster and undoes them.
type injector struct {
	c   *lab.Cluster
	tl  *timeline
	chk *checker

	mu        sync.Mutex
	bmc       map[string]int // Redfish faults in force (they overlap)
	armedKill bool
	forgers   int // forgers started (each its own port and files)
	stopped   map[signaler]bool
}

// signaler is a process a fault can stop and continue.
type signaler interface{ Signal(syscall.Signal) }

func newInjector(c *lab.Cluster, tl *timeline, chk *checker) *injector {
	in := &injector{c: c, tl: tl, chk: chk, bmc: map[string]int{}, stopped: map[signaler]bool{}}
	c.OnPowerOff = in.poweredOff
	return in
}

// host resolves a host name of the schedule.
func (in *injector) host(name string) *netns.Host {
	switch {
	case name == "hub":
		return in.c.HubHost
	case strings.HasPrefix(name, "w-"):
		for _, h := range in.c.Witnesses {
			if h.Name == name {
				return h
			}
		}
	default:
		return in.c.Machine(name).Host
	}
	in.c.T.Fatalf("chaos: no host %s", name)
	return nil
}

func (in *injector) hosts(names []string) []*netns.Host {
	var out []*netns.Host
	for _, n := range names {
		out = append(out, in.host(n))
	}
	return out
}

// agentProc is the agent process of a machine or witness.
func (in *injector) agentProc(name string) *proc.Process {
	if strings.HasPrefix(name, "w-") {
		return in.c.Witness(name)
	}
	_, agent, _ := in.c.Machine(name).Procs()
	return agent
}

// play runs the schedule: each fault at its time, undone when its time is over; it returns when every
// fault is over.
func (in *injector) play(ctx context.Context, s schedule, start time.Time) {
	var wg sync.WaitGroup
	for _, f := range s.Faults {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleepUntil(ctx, start.Add(f.At)) {
				return
			}
			in.apply(ctx, f)
		}()
	}
	wg.Wait()
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Until(t)):
		return true
	}
}

// apply carries out one fault and, after its time, undoes it.
func (in *injector) apply(ctx context.Context, f fault) {
	in.tl.add("fault", "", f.String()+fmt.Sprintf(" for %.1fs", f.For.Seconds()))
	end := func() { sleepUntil(ctx, time.Now().Add(f.For)) }
	switch f.Kind {
	case killEtcd:
		if etcd, _, on := in.c.Machine(f.A[0]).Procs(); on {
			etcd.Signal(syscall.SIGKILL)
		}
	case stopEtcd:
		if etcd, _, on := in.c.Machine(f.A[0]).Procs(); on {
			in.pause(etcd, end)
		}
	case killAgent:
		in.restartAgent(f.A[0], end)
	case stopAgent:
		in.pause(in.agentProc(f.A[0]), end)
	case killHub:
		old := in.c.KillHub()
		end()
		if in.c.RestartHub(old) {
			in.tl.add("restart", "hub", "")
		}
	case stopHub:
		in.pause(in.c.HubProc(), end)
	case killHubStep:
		in.mu.Lock()
		in.armedKill = true
		in.mu.Unlock()
		end()
		in.mu.Lock()
		in.armedKill = false
		in.mu.Unlock()
	case partition:
		in.cut(in.hosts(f.A), in.hosts(f.B), end)
	case flap:
		a, b := in.hosts(f.A), in.hosts(f.B)
		for stop := time.Now().Add(f.For); time.Now().Before(stop) && ctx.Err() == nil; {
			in.cut(a, b, func() { time.Sleep(time.Duration(1000+rand.IntN(1000)) * time.Millisecond) })
			time.Sleep(time.Duration(1000+rand.IntN(1000)) * time.Millisecond)
		}
	case oneWay:
		in.drop(in.hosts(f.A), in.hosts(f.B), 1, end)
	case loss:
		a, b := in.hosts(f.A), in.hosts(f.B)
		in.c.Lab.Drop(b, a, f.P)
		in.drop(a, b, f.P, end)
		in.c.Lab.Undrop(b, a, f.P)
	case bmcNet:
		in.cut([]*netns.Host{in.c.HubHost}, []*netns.Host{in.c.OOB}, end)
	case bmcSlow, bmc500, bmcAuth, bmcIgnore:
		in.setBMC(f.Kind, 1)
		end()
		in.setBMC(f.Kind, -1)
	case ipmiStop:
		for _, sim := range in.c.IPMI {
			in.pause(sim, end)
		}
	case opPause:
		in.brake(ctx, f, []string{"pause", "--wait", "--timeout", "60s", "--reason", "chaos"}, []string{"resume"})
	case opSuspend:
		in.brake(ctx, f, []string{"suspend", "--reason", "chaos"}, []string{"unsuspend"})
	case opDetach:
		in.brake(ctx, f, []string{"detach", f.A[0], "--reason", "chaos"}, []string{"attach", f.A[0]})
	case forge:
		in.forge(f.A[0], in.host(f.B[0]), end)
	case rekey:
		in.rekey(ctx, f.A[0])
	case rogue:
		m := in.c.Machine(f.A[0])
		out, err := in.c.HubHost.Run(in.c.Bins.Hub, "bmc", "power", "cycle", m.BMC, "--credentials", m.Creds)
		in.tl.add("rogue", m.Name, fmt.Sprintf("hub bmc power cycle: %v %s", err, firstLine(out)))
	case opReboot:
		args := []string{"reboot", f.A[0], "--wait"}
		if f.Force {
			args = append(args, "--force", "--yes")
		}
		in.operator(ctx, "reboot", f.A[0], args)
	case opRecover:
		in.chk.awaitPlanning(ctx, 6*time.Second)
		in.operator(ctx, opRecover, "", []string{"recover", "--yes"})
	case lose:
		var wg sync.WaitGroup
		for _, name := range f.A {
			wg.Go(func() { in.c.Machine(name).LoseForGood() })
		}
		wg.Wait()
	case opRecoverAll:
		in.recoverAll(ctx, time.Now().Add(f.For))
	}
}

// rekey rotates machine name's identity key (see the rekey fault).
func (in *injector) rekey(ctx context.Context, name string) {
	c := in.c
	key := c.IdentityFile(name)
	out, err := exec.Command(c.Bins.Agent, "-node", name, "-identity-file", key+".new", "-print-identity").Output()
	if err != nil {
		in.tl.add("rekey", name, fmt.Sprintf("making the new key: %v", err))
		return
	}
	line := strings.TrimSpace(string(out))
	old, err := os.ReadFile(c.PinnedFile)
	if err != nil {
		in.tl.add("rekey", name, fmt.Sprintf("reading the pinned keys: %v", err))
		return
	}
	settle := 2*health.KeyFileCheck + time.Second // every member reads the file again
	c.Replace(c.PinnedFile, string(old)+line+"\n")
	in.tl.add("rekey", name, "new key pinned beside the old")
	if !sleepUntil(ctx, time.Now().Add(settle)) {
		return
	}
	if err := os.Rename(key+".new", key); err != nil {
		in.tl.add("rekey", name, fmt.Sprintf("swapping the key: %v", err))
		return
	}
	in.restartAgent(name, func() {})
	in.tl.add("rekey", name, "agent restarted on the new key")
	if !sleepUntil(ctx, time.Now().Add(settle)) {
		return
	}
	var kept []string
	for _, l := range strings.Split(strings.TrimSpace(string(old)), "\n") {
		if f := strings.Fields(l); len(f) == 0 || f[0] != name {
			kept = append(kept, l)
		}
	}
	c.Replace(c.PinnedFile, strings.Join(append(kept, line), "\n")+"\n")
	in.tl.add("rekey", name, "old key dropped")
}

// forge runs a forger of name on host h until end returns (see the forge fault).
func (in *injector) forge(name string, h *netns.Host, end func()) {
	in.mu.Lock()
	in.forgers++
	n := in.forgers
	in.mu.Unlock()
	c := in.c
	cfg := c.Write(fmt.Sprintf("forger-%d.yaml", n), c.AgentConfig(name, h.Addr(7950+n), c.IdentityFile(fmt.Sprintf("forger-%d", n)),
		"http://127.0.0.1:1", fmt.Sprintf("127.0.0.1:%d", 9200+n)))
	p := h.Start(fmt.Sprintf("forger-%d", n), c.Bins.Agent, "-config", cfg)
	end()
	p.Signal(syscall.SIGKILL)
	<-p.Done()
}

// pause stops p (SIGSTOP) until end returns, then continues it.
func (in *injector) pause(p signaler, end func()) {
	p.Signal(syscall.SIGSTOP)
	in.mu.Lock()
	in.stopped[p] = true
	in.mu.Unlock()
	end()
	p.Signal(syscall.SIGCONT)
	in.mu.Lock()
	delete(in.stopped, p)
	in.mu.Unlock()
}

// restartAgent kills an agent and starts it again after end returns, unless its machine's power did
// that meanwhile.
func (in *injector) restartAgent(name string, end func()) {
	if strings.HasPrefix(name, "w-") {
		old := in.c.Witness(name)
		old.Signal(syscall.SIGKILL)
		<-old.Done()
		end()
		in.c.RestartWitness(name)
		in.tl.add("restart", name, "agent")
		return
	}
	if in.c.Machine(name).RestartAgent(end) {
		in.tl.add("restart", name, "agent")
	}
}

// cut cuts a from b until end returns.
func (in *injector) cut(a, b []*netns.Host, end func()) {
	in.c.Lab.Cut(a, b)
	end()
	in.c.Lab.Uncut(a, b)
}

func (in *injector) drop(a, b []*netns.Host, p float64, end func()) {
	in.c.Lab.Drop(a, b, p)
	end()
	in.c.Lab.Undrop(a, b, p)
}

// setBMC adds (+1) or removes (-1) a Redfish fault; overlapping ones combine.
func (in *injector) setBMC(kind string, delta int) {
	if in.c.Redfish == nil {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.bmc[kind] += delta
	var f bmcsim.Faults
	if in.bmc[bmcSlow] > 0 {
		f.Latency = 3 * time.Second
	}
	if in.bmc[bmc500] > 0 && delta > 0 && kind == bmc500 {
		f.Fail500 = 4
	}
	f.RejectAuth = in.bmc[bmcAuth] > 0
	f.IgnoreResets = in.bmc[bmcIgnore] > 0
	in.c.Redfish.SetFaults(f)
}

// brake applies an operator's brake (pause, suspend, detach) and lifts it after the fault's time. The
// brake is "in force" for the checker from the moment its command succeeded until its lifting command
// is issued; a lift is retried until the hub takes it (an operator would).
func (in *injector) brake(ctx context.Context, f fault, on, off []string) {
	target := ""
	if len(f.A) > 0 {
		target = f.A[0]
	}
	ok := in.operator(ctx, f.Kind, target, on)
	if ok {
		in.tl.add("brake-on", target, f.Kind)
	}
	sleepUntil(ctx, time.Now().Add(f.For))
	in.tl.add("brake-off", target, f.Kind)
	for ctx.Err() == nil && !in.operator(ctx, "un"+f.Kind, target, off) {
		time.Sleep(2 * time.Second)
	}
}

// operator runs a hub command as an operator would, recording it and its answer.
func (in *injector) operator(ctx context.Context, what, target string, args []string) bool {
	_, ok := in.record(command{what: what, target: target, args: args, run: func() (string, error) { return in.c.HubCommand(ctx, args...) }})
	return ok
}

// record runs an operator's command (its output's last line is its error when it fails), recording
// it and its answer; it returns the output and whether the command succeeded.
func (in *injector) record(cmd command) (string, bool) {
	in.tl.add("op-start", cmd.target, strings.Join(cmd.args, " "))
	out, err := cmd.run()
	verdict := "ok"
	if err != nil {
		verdict = "failed: " + lastLine(out) // the command's error ("hub: ..."), after what it printed
	}
	in.tl.add("op-end", cmd.target, cmd.what+": "+verdict)
	return out, err == nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	if len(line) > 160 {
		line = line[:160] + "…"
	}
	return line
}

// lastLine is s's last line, whole: a command's error, which says why and what to do.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// poweredOff kills the hub when a kill-hub-bmc fault is armed: inside the BMC step that took m down.
func (in *injector) poweredOff(m *lab.Machine) {
	in.mu.Lock()
	armed := in.armedKill
	in.armedKill = false
	in.mu.Unlock()
	if !armed {
		return
	}
	old := in.c.KillHub()
	if old == nil {
		return
	}
	in.tl.add("fault", "hub", "killed as "+m.Name+" went down")
	go func() {
		time.Sleep(2 * time.Second)
		if in.c.RestartHub(old) {
			in.tl.add("restart", "hub", "")
		}
	}()
}

// quiet undoes whatever may remain of the faults: every rule, every stopped process, dead agents and
// hub, BMC faults. Killed etcd members stay down: healing them is the hub's job.
func (in *injector) quiet() {
	in.c.Lab.Heal()
	in.mu.Lock()
	for p := range in.stopped {
		p.Signal(syscall.SIGCONT)
	}
	in.stopped = map[signaler]bool{}
	in.bmc = map[string]int{}
	in.mu.Unlock()
	if in.c.Redfish != nil {
		in.c.Redfish.SetFaults(bmcsim.Faults{})
	}
	if !in.c.HubProc().Running() {
		in.c.StartHub()
		in.tl.add("restart", "hub", "quiet")
	}
}
