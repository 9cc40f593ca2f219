package kube

// Shared is the package's API server, for its external tests (package kube_test: those of the
// packages that import kube, such as kube/claim).
var Shared = &shared
