// Package kubeassets says where the kube-apiserver, etcd and kubectl binaries that
// test/kube/build-assets builds are, for every test and bench that runs them.
package kubeassets

import (
	"os"
	"path/filepath"
)

// Dir is the directory of kube-apiserver, etcd and kubectl: $KUBEBUILDER_ASSETS, or where
// test/kube/build-assets builds them.
func Dir() string {
	if a := os.Getenv("KUBEBUILDER_ASSETS"); a != "" {
		return a
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "hale", "kube-assets-1.36.3")
}
