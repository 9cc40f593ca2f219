// Command kubecluster brings up test/lab's real kubeadm cluster with Hale installed, for trying Hale
// on Kubernetes without machines of one's own: three control-plane nodes and two workers (privileged
// podman containers running systemd, containerd and the kubelet, made by kubeadm), each powered by a
// BMC (the Redfish simulator, ipmi_sim for cp-2), and Hale installed as docs/install.md says. It runs
// until interrupted, then tears everything down. As root, on Linux with Debian's podman, runc, haproxy,
// mmdebstrap, umoci, iproute2, iptables, openipmi and ipmitool; the first run builds the nodes (several
// minutes). sudo's secure_path has no Go: keep the caller's PATH.
//
//	sudo env "PATH=$PATH" go run ./test/kubecluster           # up, until Ctrl-C: down
//	sudo env "PATH=$PATH" go run ./test/kubecluster -clean    # remove what a killed run left behind
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hale-dev/hale/test/lab"
	"github.com/hale-dev/hale/test/netns"
)

func main() {
	clean := flag.Bool("clean", false, "remove the node containers, disks and network namespaces a killed run left, and exit")
	flag.Parse()
	if why := lab.KubeAvailable(); why != "" {
		fmt.Fprintf(os.Stderr, "kubecluster: %s\n", why)
		os.Exit(2)
	}
	dir, err := os.MkdirTemp("", "hale-kubecluster-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubecluster: %v\n", err)
		os.Exit(1)
	}
	p := &netns.Program{Dir: dir, Log: os.Stdout}
	err = p.Run(func() { up(p, *clean) })
	p.Close()
	_ = os.RemoveAll(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubecluster: %v\n", err)
		os.Exit(1)
	}
}

// up brings the cluster up with Hale and keeps it until interrupted (clean: removes what a killed run
// left behind instead).
func up(p *netns.Program, clean bool) {
	if clean {
		lab.RemoveKubeLeftovers(p)
		netns.New(p).Close() // a new lab first removes what dead ones left
		fmt.Println("kubecluster: nothing left behind")
		return
	}
	assets, err := lab.KubeAssets()
	if err != nil {
		p.Fatalf("%v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	c, _ := lab.UpWithHale(ctx, p, assets, lab.KubeOptions{
		OnEvent: func(kind, target, detail string) {
			if kind != "bmc-request" {
				fmt.Printf("%s  %s %s (%s)\n", time.Now().Format("15:04:05"), kind, target, detail)
			}
		}})
	var nodes, tries []string
	for _, n := range c.Nodes {
		nodes = append(nodes, n.Name+" = "+n.Container())
	}
	for _, try := range lab.Tries() {
		tries = append(tries, fmt.Sprintf("  %-58s # %s", try.Line, try.Shows))
	}
	fmt.Printf(`kubecluster: Hale is installed (%s in all). In another shell, as root, open an operator's
shell on the cluster's admin host:

  %s

and type in it:
%s

To hang a node (the hub power-cycles it through its BMC within seconds): podman pause NODE, in any
shell as root; the nodes: %s.

Ctrl-C tears it all down.
`, time.Since(start).Round(time.Second), c.AdminShell(), strings.Join(tries, "\n"), strings.Join(nodes, ", "))
	<-ctx.Done()
	fmt.Println("kubecluster: tearing down")
}
