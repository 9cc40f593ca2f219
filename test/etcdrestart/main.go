// Command etcdrestart measures what docs/design.md ("The verdict is not the action") says of a member
// that rejoins after a partition: etcd's leader, cut off with the hub on the minority side for 60 s
// (packets dropped as they arrive, both ways; -silent=false drops them as they leave too), then the partition healed in one step. How long
// until it serves a linearizable read again (etcd#14027's signature meanwhile: "waiting for ReadIndex
// response took too long"), left alone, against its etcd restarted at the heal as a kubelet restarting
// its container would (new peer connections)? Each run is a network-namespace lab of its own (real etcd
// processes as static pods, no hub), the two kinds side by side. It needs root.
//
//	sudo env "PATH=$PATH" go run ./test/etcdrestart -runs 3
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hale-dev/hale/test/lab"
	"github.com/hale-dev/hale/test/netns"
)

func main() {
	runs := flag.Int("runs", 3, "runs of each kind")
	hold := flag.Duration("partition", 60*time.Second, "how long the partition lasts")
	silent := flag.Bool("silent", true, "drop packets as they arrive only (a sender's writes go unanswered), not as they leave too (its writes fail at once)")
	flag.Parse()
	if why := netns.Available(); why != "" {
		fmt.Fprintln(os.Stderr, "etcdrestart:", why)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "hale-etcdrestart-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdrestart:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	bins, err := netns.Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdrestart:", err)
		os.Exit(1)
	}
	var wg sync.WaitGroup
	failed := false
	var mu sync.Mutex
	for i := range *runs {
		for _, restart := range []bool{false, true} {
			wg.Go(func() {
				took, err := once(dir, bins, *hold, restart, *silent)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed = true
					fmt.Printf("run %d, restarted %v: %v\n", i, restart, err)
					return
				}
				fmt.Printf("run %d, restarted %v: the old leader served a linearizable read %v after the heal\n", i, restart, took.Round(100*time.Millisecond))
			})
		}
	}
	wg.Wait()
	if failed {
		os.Exit(1)
	}
}

// once runs one partition on a lab of its own and returns how long after the heal etcd-0 served a
// linearizable read.
func once(dir string, bins netns.Binaries, hold time.Duration, restart, silent bool) (took time.Duration, err error) {
	logs, err := os.MkdirTemp(dir, "run-")
	if err != nil {
		return 0, err
	}
	logf, err := os.Create(logs + "/run.log")
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	p := &netns.Program{Dir: logs, Log: logf}
	defer p.Close()
	err = p.Run(func() {
		c := lab.Start(p, bins, lab.Shape{Machines: 3}, lab.Options{StaticPods: true, NoHub: true})
		cli, err := c.EtcdClient(c.Machines[0])
		if err != nil {
			p.Fatalf("%v", err)
		}
		defer cli.Close()
		read := func(limit time.Duration) time.Duration {
			start := time.Now()
			for time.Since(start) < limit {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err := cli.Get(ctx, "hale-etcdrestart")
				cancel()
				if err == nil {
					return time.Since(start)
				}
				time.Sleep(100 * time.Millisecond)
			}
			p.Fatalf("etcd-0 served no linearizable read within %v (logs: %s)", limit, logs)
			return 0
		}
		read(90 * time.Second)
		if err := c.MoveLeader(context.Background(), c.Machines[0]); err != nil {
			p.Fatalf("%v", err)
		}
		hosts := []*netns.Host{c.Machines[0].Host, c.Machines[1].Host, c.Machines[2].Host}
		cut := c.Lab.Cut
		if silent {
			cut = c.Lab.CutSilently
		}
		cut([]*netns.Host{c.HubHost, hosts[0]}, hosts[1:])
		time.Sleep(hold)
		c.Lab.Heal()
		if restart {
			c.Machines[0].SignalEtcd(syscall.SIGKILL) // its stand-in kubelet starts it again
		}
		took = read(3 * time.Minute)
	})
	return took, err
}
