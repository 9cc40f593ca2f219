# shellcheck shell=bash
# Sourced by test/kube/build-assets, build-bmo and build-capi (not run on its own).
#
# programs_module DIR makes DIR (empty) a Go module that requires every program those scripts build, at
# the versions they pin, together with this repository's own requirements, and leaves the shell in DIR
# ready to `go build` any of them. One module graph means one version of every module the programs
# share: Go's build cache then compiles Kubernetes' API types, client and apiserver library,
# controller-runtime, etcd's client and gRPC once for kube-apiserver, kubectl, etcd, Cluster API's
# managers and baremetal-operator, and Hale's own static binaries reuse them. Built from a module each,
# they compiled most of Kubernetes three times (837 s of a cold run on 2 cores).
#
# Where the programs' go.mod files disagree with the published modules:
# - k8s.io/kubernetes replaces each k8s.io staging module with ./staging/...: each is replaced here by
#   its published version (v0.36.3 for v1.36.3).
# - Cluster API's modules name each other v0.0.0-00010101… with local replaces: each is required and
#   replaced at the published tag.
# - baremetal-operator requires ironic-standalone-operator/api v0.8.2, which the module proxy refuses
#   (v0.8.1 too); v0.8.0 is served, with no entry in the checksum database, hence GONOSUMDB for metal3's
#   modules. Its ./pkg/hardwareutils replace is a nested module left out of the zip: the v0.5.1 it
#   names is served.
# Every program is built with CGO_ENABLED=0 and -trimpath, as Hale's static binaries are (test/run).

k8s_version=v1.36.3
k8s_staging=v0.36.3
etcd_version=v3.6.16
capi_version=v1.14.2
bmo_version=v0.13.2
programs_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

programs_module() {
	local m k8s
	cd "$1" || return 1
	export GOFLAGS=-mod=mod GONOSUMDB='github.com/metal3-io/*' CGO_ENABLED=0
	go mod init hale.local/programs >/dev/null 2>&1
	k8s=$(go mod download -json "k8s.io/kubernetes@$k8s_version" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
	if [[ -z $k8s ]]; then
		echo "test/kube: cannot download k8s.io/kubernetes@$k8s_version from the module proxy" >&2
		return 1
	fi
	go mod edit -require "k8s.io/kubernetes@$k8s_version"
	while read -r m; do
		go mod edit -replace "$m=$m@$k8s_staging"
	done < <(sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$k8s/go.mod")
	for m in sigs.k8s.io/cluster-api sigs.k8s.io/cluster-api/api sigs.k8s.io/cluster-api/test; do
		go mod edit -require "$m@$capi_version" -replace "$m=$m@$capi_version"
	done
	m=github.com/metal3-io/ironic-standalone-operator/api
	go mod edit -require "github.com/metal3-io/baremetal-operator@$bmo_version" \
		-require "github.com/metal3-io/baremetal-operator/apis@$bmo_version" -replace "$m=$m@v0.8.0" \
		-require "go.etcd.io/etcd/server/v3@$etcd_version"
	while read -r m; do
		go mod edit -require "$m"
	done < <(go mod edit -json "$programs_repo/go.mod" | sed -n 's/.*"Path": "\(.*\)",/\1/p;s/.*"Version": "\(.*\)".*/@\1/p' | paste -d '' - -)
	cat >tools.go <<'GO'
//go:build tools

package tools

import (
	_ "github.com/metal3-io/baremetal-operator"
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/controlplane/kubeadm"
	_ "sigs.k8s.io/cluster-api/core"
	_ "sigs.k8s.io/cluster-api/test/infrastructure/docker"
)
GO
	echo "test/kube: resolving the programs' modules (Kubernetes $k8s_version, etcd $etcd_version, Cluster API $capi_version, baremetal-operator $bmo_version)" >&2
	if ! go mod tidy >"$1/tidy.log" 2>&1; then
		cat "$1/tidy.log" >&2
		echo "test/kube: resolving the programs' modules failed (above)" >&2
		return 1
	fi
}
