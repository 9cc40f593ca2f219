// Package v1alpha1 is Hale's Kubernetes API, group hale.dev: Remediation (one per operation on one
// machine; the Kubernetes-mode journal: intent is written to its status before each side effect) and
// HealthPolicy (the cluster's policy, the operator's pause and suspend, and what the hub acknowledges),
// and HaleRemediation with its HaleRemediationTemplate (Cluster API's external remediation: a
// MachineHealthCheck's request that Hale remediate a Machine).
//
// +kubebuilder:object:generate=true
// +groupName=hale.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is hale.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "hale.dev", Version: "v1alpha1"}

// AddToScheme registers the types with a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Remediation{}, &RemediationList{}, &HealthPolicy{}, &HealthPolicyList{},
		&HaleRemediation{}, &HaleRemediationList{}, &HaleRemediationTemplate{}, &HaleRemediationTemplateList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
