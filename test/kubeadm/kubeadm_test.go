// Package kubeadm runs Hale on a real kubeadm control plane (test/lab's kubeadm cluster): three
// control-plane nodes and two workers, each a systemd machine with containerd and a kubelet, powered
// by a BMC.
package kubeadm

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/lab"
)

var assets string

func TestMain(m *testing.M) {
	if why := lab.KubeAvailable(); why != "" {
		fmt.Fprintf(os.Stderr, "test/kubeadm: %s: these tests need root, podman and haproxy\n", why)
		os.Exit(1)
	}
	var err error
	if assets, err = lab.KubeAssets(); err != nil {
		fmt.Fprintf(os.Stderr, "test/kubeadm: %v\n", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func TestKubeadmControlPlane(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	c := lab.StartKube(t, assets, lab.KubeShape{ControlPlanes: 3, Workers: 2, IPMI: 1}, lab.KubeOptions{})
	t.Logf("cluster up in %s", time.Since(start).Round(time.Second))
	out, err := c.Kubectl(ctx, "get", "pods", "-n", "kube-system", "-o", "wide")
	require.NoError(t, err)
	t.Log(out)
	for _, n := range c.ControlPlanes() {
		for _, p := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			require.Contains(t, out, p+"-"+n.Name)
		}
	}
	for _, n := range c.ControlPlanes() {
		out, err = n.Exec(ctx, "crictl", "ps", "--name", "etcd", "-q")
		require.NoError(t, err)
		require.NotEmpty(t, strings.TrimSpace(out), "no etcd container runs on %s", n.Name)
	}
}
