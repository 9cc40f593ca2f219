package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/kube/enrol"
)

// enrolment is this replica's enrolment of its identity key, and its pinned keys from the ConfigMap
// the leader keeps (--enrol): pinned for every name of its pod (enrol.HubPinName).
func (k *kubeOptions) enrolment(o runOptions, log *slog.Logger) (*identity.Enrolment, error) {
	id, created, err := identity.LoadOrCreateIdentity(o.identityFile)
	if err != nil {
		return nil, err
	}
	_, cfg, err := k.kubeClient()
	if err != nil {
		return nil, err
	}
	httpc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("the API server's client: %w", err)
	}
	host, _ := os.Hostname()
	if created {
		log.Info("created this replica's identity key; enrolling it through the API server", "file", o.identityFile, "key", id.Public().String())
	}
	return &identity.Enrolment{Server: cfg.Host, Client: httpc, Namespace: k.namespace, ConfigMap: identity.PinnedConfigMap, Node: enrol.HubPinName(host),
		Identity: id, Copy: o.pinnedFile, Log: log}, nil
}

// checkEnrol says what is wrong with --enrol's settings.
func checkEnrol(o runOptions) error {
	switch {
	case o.noIdentities:
		return errors.New("--enrol and --insecure-no-identities: enrolment is for identities; remove one")
	case o.node != "":
		return fmt.Errorf("--enrol and --node %s: an enrolled replica's names are its pod's (hub-POD-RANDOM, pinned as hub-POD-*); remove --node", o.node)
	case o.identityFile == "" || o.pinnedFile == "":
		return errors.New("--enrol needs --identity-file (this replica's own key, created when missing) and --pinned-file (its local copy of the pinned keys, read at a start while the API server is down)")
	}
	return nil
}

// enroller answers the enrolments of the members in --namespace (enrol.Enroller): the accounts of
// --enrol-agents pin their nodes' keys, those of --enrol-hubs their pods'.
func (k *kubeOptions) enroller(c client.Client, log *slog.Logger) *enrol.Enroller {
	return &enrol.Enroller{Client: c, Pinned: enrol.PinnedKeys{Client: c, Key: client.ObjectKey{Namespace: k.namespace, Name: identity.PinnedConfigMap}},
		Agents: enrol.Accounts(k.namespace, k.agents), Hubs: enrol.Accounts(k.namespace, k.hubs), Log: log}
}
