package health

import "github.com/hale-dev/hale/health/report"

func init() {
	RegisterProbe(ProbeKind{Name: "etcd", Judged: report.JudgedTimeouts()["etcd"], Section: func() ProbeSection { return &EtcdSection{} },
		Help: "the local member answers Status and a linearizable read, with no alarm (NOSPACE, CORRUPT), through `etcd:` above; 30s more while it catches up"})
}

// EtcdSection is probes.etcd: the member is the one etcd: names.
type EtcdSection struct {
	ProbeSettings
}

// New makes the etcd probe of the agent's member; nothing on a node without one.
func (s *EtcdSection) New(env ProbeEnv) (Probe, error) {
	if env.Etcd == nil {
		return nil, nil
	}
	return env.Etcd.Probe(), nil
}
