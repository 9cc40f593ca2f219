// Command pause is the sandbox ("pause") container of the real-cluster lab's nodes: the process that
// holds a pod's namespaces while the pod's containers come and go. It waits until it is told to stop
// (SIGINT or SIGTERM) and, as the first process of the pod's PID namespace when the pod shares one,
// reaps the orphans handed to it. Built from this module because no image registry is reachable;
// test/kube/build-cluster packs it as registry.k8s.io/pause, the name containerd asks for.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
