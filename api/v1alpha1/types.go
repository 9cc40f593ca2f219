package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels Hale puts on its objects.
const (
	// LabelMachine names the machine a Remediation is about (for listing a machine's history).
	LabelMachine = "hale.dev/machine"
	// LabelPhase mirrors status.phase (for listing what is in progress without reading every object).
	LabelPhase = "hale.dev/phase"
)

// RemediationPhase is where a remediation stands.
// +kubebuilder:validation:Enum=InProgress;Succeeded;Failed;Aborted
type RemediationPhase string

// Remediation phases; only InProgress is unfinished.
const (
	PhaseInProgress RemediationPhase = "InProgress"
	PhaseSucceeded  RemediationPhase = "Succeeded"
	PhaseFailed     RemediationPhase = "Failed"
	PhaseAborted    RemediationPhase = "Aborted"
)

// RemediationSpec is what was asked: by the hub, or by an operator (`hub reboot` creates one, so
// Kubernetes RBAC decides who may reboot).
type RemediationSpec struct {
	// Machine is the machine's name in Hale's inventory.
	// +kubebuilder:validation:MinLength=1
	Machine string `json:"machine"`
	// Strategy is how it is healed.
	// +kubebuilder:validation:Enum=reboot;fence;replace
	Strategy string `json:"strategy"`
	// RequestedBy is "hub" for the hub's own, else who asked.
	RequestedBy string `json:"requestedBy,omitempty"`
	// Reason says why.
	Reason string `json:"reason,omitempty"`
	// Hard power-cycles at once instead of a graceful restart first.
	Hard bool `json:"hard,omitempty"`
	// Force goes ahead over a quorum refusal; the refusal is recorded in the history.
	Force bool `json:"force,omitempty"`
	// Steps is the plan, as the hub wrote it ("power-cycle etcd-2", "await-healthy etcd-2").
	Steps []string `json:"steps,omitempty"`
	// Attempt counts the machine's remediations since it was last healthy, this one included.
	Attempt int32 `json:"attempt,omitempty"`
	// AgentStarted is when the machine's agent had started before the remediation: it counts as back
	// only with a report from an agent started later.
	AgentStarted *metav1.Time `json:"agentStarted,omitempty"`
	// Members are the etcd members when it began: for a replace, the one that joins later is its
	// replacement (the steps name it with a placeholder: the owner picks the real name).
	Members []string `json:"members,omitempty"`
	// WhileDead: the hub began it because the machine was dead to a majority of the observers; a sign
	// of life before a disruptive request goes out withdraws it (the machine resumed by itself).
	WhileDead bool `json:"whileDead,omitempty"`
}

// RemediationEvent is one line of a remediation's history: an intent written before a side effect,
// its outcome after, or a note.
type RemediationEvent struct {
	// Time is when it was written.
	Time metav1.MicroTime `json:"time"`
	// Step is the index of the step in spec.steps (-1 for a note).
	Step int32 `json:"step"`
	// Kind is intent (written before a side effect), outcome (after it) or note.
	// +kubebuilder:validation:Enum=intent;outcome;note
	Kind string `json:"kind"`
	// Result is what an outcome says happened, for the hub to read back (detail is for people).
	// +kubebuilder:validation:Enum=Done;Failed;HandedOver;OldRemoved;Replaced;NotRepeated;Retaken;Withdrawn
	// +optional
	Result string `json:"result,omitempty"`
	// Ends, on the note that ends the remediation, is the state it ends in.
	// +kubebuilder:validation:Enum=Succeeded;Failed;Aborted
	// +optional
	Ends string `json:"ends,omitempty"`
	// Detail says it for people.
	Detail string `json:"detail"`
	// Epoch of the hub that wrote it.
	Epoch int64 `json:"epoch"`
}

// RemediationStatus is where it stands and everything that happened.
type RemediationStatus struct {
	// Phase is InProgress, Succeeded, Failed or Aborted (refused, or withdrawn).
	Phase RemediationPhase `json:"phase,omitempty"`
	// Epoch is the newest epoch that wrote to this remediation: a hub with an older one must not write.
	Epoch int64 `json:"epoch,omitempty"`
	// History, oldest first.
	History []RemediationEvent `json:"history,omitempty"`
	// Conditions: Ready (True when Succeeded).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Remediation is one operation on one machine.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rem
// +kubebuilder:printcolumn:name="Machine",type=string,JSONPath=`.spec.machine`
// +kubebuilder:printcolumn:name="Strategy",type=string,JSONPath=`.spec.strategy`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="By",type=string,JSONPath=`.spec.requestedBy`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.spec.reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Remediation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              RemediationSpec   `json:"spec"`
	Status            RemediationStatus `json:"status,omitempty"`
}

// RemediationList is a list of Remediations.
// +kubebuilder:object:root=true
type RemediationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Remediation `json:"items"`
}

// HealthPolicySpec is the cluster's policy and the operator's brakes. Each policy setting that is set
// replaces the inventory's, from the next pass on (status condition PolicyApplied says what is in
// force, and from where).
type HealthPolicySpec struct {
	// Paused: no new step starts; acknowledged in status.pause once steps in flight reached a checkpoint.
	Paused bool `json:"paused,omitempty"`
	// Suspended: observe-only; everything is computed and explained, nothing is executed.
	Suspended bool `json:"suspended,omitempty"`
	// Detached machines: no probe-driven action and no BMC call for them (`hub detach` writes here).
	// +listType=map
	// +listMapKey=name
	Detached []DetachedMachine `json:"detached,omitempty"`
	// MinFaultTolerance: healthy voters to keep beyond quorum when a step costs one.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinFaultTolerance *int32 `json:"minFaultTolerance,omitempty"`
	// MaxInFlight: machines that are not etcd members remediated at once, per pool ("2" or "10%").
	MaxInFlight string `json:"maxInFlight,omitempty"`
	// MaxUnhealthy: when more of a pool of machines that are not etcd members are unhealthy ("2" or
	// "40%"), the whole pool is held.
	MaxUnhealthy string `json:"maxUnhealthy,omitempty"`
	// ProbeTimeouts: how long each probe must fail before its machine is Unhealthy.
	ProbeTimeouts map[string]metav1.Duration `json:"probeTimeouts,omitempty"`
	// Cooldown after a remediation before the same machine is remediated again.
	Cooldown *metav1.Duration `json:"cooldown,omitempty"`
	// MaxAttempts before the hub gives up on a machine and says so.
	// +kubebuilder:validation:Minimum=1
	MaxAttempts int32 `json:"maxAttempts,omitempty"`
	// StallTolerance: how long a machine dead to a majority of the observers must show no sign of life
	// before the hub power-cycles, fences or replaces it, unless its BMC proves a hang first.
	// +optional
	StallTolerance *QuorumWaits `json:"stallTolerance,omitempty"`
	// ComponentGrace: how long a machine whose agent reports, a component failing, is left to the
	// kubelet's (or systemd's) restart of it before the hub acts on it.
	// +optional
	ComponentGrace *QuorumWaits `json:"componentGrace,omitempty"`
}

// QuorumWaits is a wait that depends on whether etcd keeps its quorum without the machine.
type QuorumWaits struct {
	// QuorumHeld: while etcd keeps quorum without the machine (or it is no etcd member).
	// +optional
	QuorumHeld *metav1.Duration `json:"quorumHeld,omitempty"`
	// QuorumNeeded: when its member is needed for etcd's quorum.
	// +optional
	QuorumNeeded *metav1.Duration `json:"quorumNeeded,omitempty"`
}

// DetachedMachine is a machine the operator keeps Hale off.
type DetachedMachine struct {
	// Name is the machine's name, as `hub status` shows it.
	Name string `json:"name"`
	// By is who detached it.
	By string `json:"by,omitempty"`
	// Reason is why.
	Reason string `json:"reason,omitempty"`
	// Since is when.
	Since *metav1.Time `json:"since,omitempty"`
}

// Budget is the etcd budget the hub plans with.
type Budget struct {
	// Voters is the number of etcd voting members.
	Voters int32 `json:"voters"`
	// HealthyVoters are the voters etcd calls healthy and Hale is not disrupting.
	HealthyVoters int32 `json:"healthyVoters"`
	// Quorum is voters/2 + 1.
	Quorum int32 `json:"quorum"`
	// FaultTolerance is healthyVoters − quorum: how many more voters may be lost.
	FaultTolerance int32 `json:"faultTolerance"`
	// Available is faultTolerance − minFaultTolerance: how many healthy voters a step may take down.
	Available int32 `json:"available"`
}

// MachineSummary is one machine's verdict.
type MachineSummary struct {
	// Name is the machine's.
	Name string `json:"name"`
	// Verdict is Healthy, Suspect, Unhealthy or Unknown.
	Verdict string `json:"verdict"`
	// Reasons are the evidence behind the verdict.
	Reasons []string `json:"reasons,omitempty"`
	// Remediation is the one in flight, if any: its object's name.
	Remediation string `json:"remediation,omitempty"`
}

// HealthPolicyStatus is what the hub acknowledges.
type HealthPolicyStatus struct {
	// Pause: Running, Pausing (steps in flight have not reached a checkpoint yet) or Paused.
	Pause string `json:"pause,omitempty"`
	// ObservedGeneration is the spec generation the hub acted on.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Budget is etcd's budget as the hub last planned with it.
	Budget *Budget `json:"budget,omitempty"`
	// Machines are every machine's verdict.
	Machines []MachineSummary `json:"machines,omitempty"`
	// Conditions: Paused (whether remediations may start, and if not why) and PolicyApplied (the
	// policy in force, and from where).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// HealthPolicy is the cluster's Hale policy.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Pause",type=string,JSONPath=`.status.pause`
// +kubebuilder:printcolumn:name="Suspended",type=boolean,JSONPath=`.spec.suspended`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.budget.healthyVoters`
// +kubebuilder:printcolumn:name="Voters",type=integer,JSONPath=`.status.budget.voters`
// +kubebuilder:printcolumn:name="Budget",type=integer,JSONPath=`.status.budget.available`
type HealthPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              HealthPolicySpec   `json:"spec,omitempty"`
	Status            HealthPolicyStatus `json:"status,omitempty"`
}

// HealthPolicyList is a list of HealthPolicies.
// +kubebuilder:object:root=true
type HealthPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HealthPolicy `json:"items"`
}

// ExternalPhase is where an external remediation request (HaleRemediation) stands.
// +kubebuilder:validation:Enum=Waiting;Running;Succeeded;Failed
type ExternalPhase string

// External remediation phases.
const (
	// ExternalWaiting: Hale has not taken the request yet; status.message says why (the quorum
	// check, a brake, a remediation already under way, a machine Hale does not know).
	ExternalWaiting ExternalPhase = "Waiting"
	// ExternalRunning: Hale's remediation status.remediation is under way.
	ExternalRunning ExternalPhase = "Running"
	// ExternalSucceeded: it ended well (the machine is back, or its owner replaced it).
	ExternalSucceeded ExternalPhase = "Succeeded"
	// ExternalFailed: it ended badly; Hale handed the Machine over to its owner (its
	// OwnerRemediated condition False), as the external remediation contract says.
	ExternalFailed ExternalPhase = "Failed"
)

// HaleRemediationSpec is what a MachineHealthCheck asks of Hale for one Machine.
type HaleRemediationSpec struct {
	// Hard power-cycles at once instead of a graceful restart first.
	Hard bool `json:"hard,omitempty"`
}

// HaleRemediationStatus is what Hale did with the request, and why it waits.
type HaleRemediationStatus struct {
	// Phase is Waiting (not taken yet: message says why), Running, Succeeded or Failed (the Machine
	// then handed to its owner, unless Hale sees it Healthy).
	Phase ExternalPhase `json:"phase,omitempty"`
	// Remediation is Hale's Remediation (in the hub's namespace) that carries the request out.
	Remediation string `json:"remediation,omitempty"`
	// Message says why it waits, or how it ended.
	Message string `json:"message,omitempty"`
	// Conditions: Processing (True while Hale works on it), Succeeded (True or False once it ended).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// HaleRemediation is a MachineHealthCheck's request that Hale remediate a Machine (Cluster API's
// external remediation: the MachineHealthCheck creates it from a HaleRemediationTemplate, named after
// the Machine, in the Machine's namespace, and deletes it once the Machine is healthy). Hale carries
// it out as `hub reboot` would, through its quorum check, brakes and journal, the machine's own way
// (through its BMC, or handed to its owner).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Remediation",type=string,JSONPath=`.status.remediation`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type HaleRemediation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              HaleRemediationSpec   `json:"spec,omitempty"`
	Status            HaleRemediationStatus `json:"status,omitempty"`
}

// HaleRemediationList lists HaleRemediations.
// +kubebuilder:object:root=true
type HaleRemediationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HaleRemediation `json:"items"`
}

// HaleRemediationTemplateResource is what a HaleRemediation is made from.
type HaleRemediationTemplateResource struct {
	Spec HaleRemediationSpec `json:"spec"`
}

// HaleRemediationTemplateSpec holds the template.
type HaleRemediationTemplateSpec struct {
	Template HaleRemediationTemplateResource `json:"template"`
}

// HaleRemediationTemplate is what a MachineHealthCheck's spec.remediation.templateRef names to hand
// its unhealthy Machines to Hale.
// +kubebuilder:object:root=true
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
type HaleRemediationTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              HaleRemediationTemplateSpec `json:"spec,omitempty"`
}

// HaleRemediationTemplateList lists HaleRemediationTemplates.
// +kubebuilder:object:root=true
type HaleRemediationTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HaleRemediationTemplate `json:"items"`
}
