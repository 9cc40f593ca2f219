package pass

// Reason says what a notice is about: a CamelCase word, as a Kubernetes Event's reason.
type Reason string

// Notice reasons. About a machine:
const (
	ReasonHealthy                Reason = "Healthy"
	ReasonSuspect                Reason = "Suspect"
	ReasonUnhealthy              Reason = "Unhealthy"
	ReasonRemediationNotBegun    Reason = "RemediationNotBegun"
	ReasonRemediationStarted     Reason = "RemediationStarted"
	ReasonStepDone               Reason = "StepDone"
	ReasonRemediated             Reason = "Remediated"
	ReasonRemediationFailed      Reason = "RemediationFailed"
	ReasonRemediationInterrupted Reason = "RemediationInterrupted"
	ReasonRemediationResumed     Reason = "RemediationResumed"
	ReasonResumeStalled          Reason = "ResumeStalled"
	ReasonJournalWriteFailing    Reason = "JournalWriteFailing"
	ReasonJournalWriteRecorded   Reason = "JournalWriteRecorded"
	ReasonDetached               Reason = "Detached"
	// ReasonBMCNotReady: the readiness check of its BMC failed (unreachable, login refused, no such
	// system, a bad answer): Hale could not heal it; ReasonBMCReady: it passes again.
	ReasonBMCNotReady Reason = "BMCNotReady"
	ReasonBMCReady    Reason = "BMCReady"
	// ReasonResumed: an Unhealthy machine came back by itself, nothing done (an episode, episode.go).
	ReasonResumed Reason = "Resumed"
)

// Why a remediation a machine needs is not started (a hold): each kind of hold is said under one
// reason, when the hold changes. The machine's own: Detached and RemediationNotBegun above, and
const (
	// ReasonWaiting: the planner keeps it waiting (etcd's quorum budget, a pool's limits).
	ReasonWaiting     Reason = "Waiting"
	ReasonHeldByOwner Reason = "HeldByOwner"
	// ReasonPlannedWork: planned work is under way on it (Machine.PlannedWork); the hub waits for its end.
	ReasonPlannedWork Reason = "PlannedWork"
	// ReasonExternallyChecked: another health checker judges it and hands its remediations to Hale
	// (Machine.CheckedBy); the hub waits for that checker's request.
	ReasonExternallyChecked Reason = "ExternallyChecked"
	// ReasonBMCLoginBackoff: its BMC account refused the credentials; no login until the backoff ends.
	ReasonBMCLoginBackoff Reason = "BMCLoginBackoff"
	ReasonCoolingDown     Reason = "CoolingDown"
	// ReasonMayResume: dead to a majority of the observers within its stall tolerance, no proof of a
	// hang from its BMC: it may resume by itself (stall.go).
	ReasonMayResume Reason = "MayResume"
	// ReasonRestartFirst: its agent reports, a component fails: the kubelet's (or systemd's) restart of
	// it comes first, for the component grace (stall.go).
	ReasonRestartFirst Reason = "RestartFirst"
	// ReasonSilentVotersFirst: etcd lost quorum and this machine's member answers: the silent ones first.
	ReasonSilentVotersFirst Reason = "SilentVotersFirst"
	// ReasonMemberAnswers: etcd lost quorum, every voter's member answers, this one's among them: a
	// cycle of a running member is no free action (DESIGN.md rule 13).
	ReasonMemberAnswers Reason = "MemberAnswers"
	// ReasonSurvivor: the survivor of an etcd recovery, until the rebuilt cluster is seen healthy.
	ReasonSurvivor Reason = "Survivor"
	// ReasonRejoined: a member of the old cluster an etcd recovery replaced, seen back in the new one:
	// retired no more.
	ReasonRejoined Reason = "Rejoined"
	// ReasonCommonCause: a probe fails alike on a strict majority of the voters' machines while their
	// members are healthy (commonCauses).
	ReasonCommonCause Reason = "CommonCause"
	// Those an operator must resolve (OperatorNeed).
	ReasonUnseen   = Reason(NeedUnseen)
	ReasonFenced   = Reason(NeedFenced)
	ReasonGaveUp   = Reason(NeedGaveUp)
	ReasonFlapping = Reason(NeedFlapping)
	ReasonRetired  = Reason(NeedRetired)
	// The hub's brakes, over what the planner admitted.
	ReasonPaused      Reason = "Paused"
	ReasonSuspended   Reason = "Suspended"
	ReasonRateLimited Reason = "RateLimited"
)

// About the hub as a whole (no machine):
const (
	ReasonObserverMajorityLost  Reason = "ObserverMajorityLost"
	ReasonObserverMajorityHeard Reason = "ObserverMajorityHeard"
	// ReasonQuorumLost: etcd has lost quorum in the hub's view (a planning pass counts fewer healthy
	// voters than quorum needs); ReasonQuorumBack: it is back, and evidence counts again from now.
	ReasonQuorumLost        Reason = "QuorumLost"
	ReasonQuorumBack        Reason = "QuorumBack"
	ReasonNotPlanning       Reason = "NotPlanning"
	ReasonBrake             Reason = "Brake"
	ReasonBrakeNotRecorded  Reason = "BrakeNotRecorded"
	ReasonInventoryReloaded Reason = "InventoryReloaded"
	ReasonPolicyChanged     Reason = "PolicyChanged"
	// ReasonEtcdClusterChanged: the members report another etcd cluster ID (a cluster rebuilt); the
	// raft mark starts again. ReasonRaftMarkNotRecorded: the journal refused the raft mark.
	ReasonEtcdClusterChanged  Reason = "EtcdClusterChanged"
	ReasonRaftMarkNotRecorded Reason = "RaftMarkNotRecorded"
	// ReasonQuorumLostForGood: etcd's quorum is lost for good (QuorumLoss.ForGood), or no longer.
	ReasonQuorumLostForGood Reason = "QuorumLostForGood"
	// ReasonDegradedMode: what a hub did while the API server did not answer (Kubernetes mode's degraded
	// mode), said once it answers again.
	ReasonDegradedMode Reason = "DegradedMode"
	// ReasonEtcdRecovery: an etcd recovery after a permanent loss of quorum (`hub recover --yes`), and
	// each member it fenced, said once the API server answers again.
	ReasonEtcdRecovery Reason = "EtcdRecovery"
	// ReasonOutOfService: the hub put the out-of-service taint on a fenced machine's Node (its BMC
	// reads it Off), or could not; ReasonInService: it took the taint off again (the machine is back,
	// or no longer known off).
	ReasonOutOfService Reason = "OutOfService"
	ReasonInService    Reason = "InService"
)

// Notice is one thing the hub decided or saw: about one machine (a verdict, a wait, a remediation's
// start, steps and end) or, with no machine, about the hub as a whole. It is the hub's one event
// path (say): the log line (with the machine, reason and remediation as attributes), the timeline
// (`hub` events, the demo), the Kubernetes Event (Config.Notify) and the metric
// hale_hub_notices_total{reason}. Repeats are not said: a wait or a hold is said when it changes.
type Notice struct {
	Machine string
	Reason  Reason
	// Remediation is the remediation it is about, if any.
	Remediation string
	// Message is the whole sentence, as the timeline and the Event show it.
	Message string
	Warning bool
}
