package bmcsim

import (
	"slices"
	"sync"
	"time"
)

// Power states, as Redfish names them.
const (
	On          = "On"
	Off         = "Off"
	PoweringOn  = "PoweringOn"
	PoweringOff = "PoweringOff"
)

// DefaultResetTypes is what a system allows when its config names none.
func DefaultResetTypes() []string {
	return []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "PowerCycle", "Nmi"}
}

// SystemConfig describes one simulated ComputerSystem.
type SystemConfig struct {
	ID string
	// PowerState at start: On (default) or Off.
	PowerState string
	// ResetTypes are the ResetType@Redfish.AllowableValues it advertises (default DefaultResetTypes).
	// Set OmitAllowableValues to advertise none at all.
	ResetTypes          []string
	OmitAllowableValues bool
	// OmitLastResetTime hides LastResetTime, as older BMCs do.
	OmitLastResetTime bool
	// Delays: time spent PoweringOn, time a graceful shutdown takes, time off during a cycle.
	PowerOnDelay     time.Duration
	ShutdownDelay    time.Duration
	CycleOffDuration time.Duration
}

// system is one simulated machine's power: a small state machine driven by timers.
type system struct {
	cfg SystemConfig
	// hook is called on every change between running and not running (outside the lock).
	hook func(id string, running bool)

	mu        sync.Mutex
	state     string
	lastReset time.Time
	resets    []string
	gen       int // bumped by every request; a timer from an older request does nothing
	timers    []*time.Timer
	closed    bool
	// dead: its power does not come on (a failed power supply or board).
	dead bool
	// health is its Status.Health ("": OK); log its SEL (logs.go).
	health string
	log    []logEntry
}

func newSystem(cfg SystemConfig, hook func(string, bool)) *system {
	if cfg.PowerState == "" {
		cfg.PowerState = On
	}
	if cfg.ResetTypes == nil {
		cfg.ResetTypes = DefaultResetTypes()
	}
	return &system{cfg: cfg, hook: hook, state: cfg.PowerState, lastReset: time.Now().UTC()}
}

func (s *system) snapshot() (state string, lastReset time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state, s.lastReset
}

// healthNow is its Status.Health.
func (s *system) healthNow() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.health == "" {
		return "OK"
	}
	return s.health
}

func (s *system) allows(resetType string) bool { return slices.Contains(s.cfg.ResetTypes, resetType) }

// reset carries out a ComputerSystem.Reset the way a server does.
func (s *system) reset(resetType string) {
	s.mu.Lock()
	s.resets = append(s.resets, resetType)
	s.gen++
	gen := s.gen
	running := s.state == On || s.state == PoweringOff
	var notify []bool
	switch resetType {
	case "On", "ForceOn":
		if !running {
			notify = s.powerOnLocked(gen, 0)
		}
	case "ForceOff":
		notify = s.setLocked(Off)
	case "GracefulShutdown":
		if running {
			s.state = PoweringOff
			notify = s.afterLocked(gen, s.cfg.ShutdownDelay, func() []bool { return s.setLocked(Off) })
		}
	case "GracefulRestart":
		if running {
			s.state = PoweringOff
			notify = s.afterLocked(gen, s.cfg.ShutdownDelay, func() []bool {
				n := s.setLocked(Off)
				return append(n, s.powerOnLocked(gen, s.cfg.CycleOffDuration)...)
			})
		} else {
			notify = s.powerOnLocked(gen, 0)
		}
	case "ForceRestart":
		// A warm reset: the power state stays On, the machine restarts.
		if running {
			s.state, s.lastReset = On, time.Now().UTC()
			notify = []bool{false, true}
		} else {
			notify = s.powerOnLocked(gen, 0)
		}
	case "PowerCycle":
		notify = s.setLocked(Off)
		notify = append(notify, s.powerOnLocked(gen, s.cfg.CycleOffDuration)...)
	}
	s.mu.Unlock()
	s.notify(notify)
}

// setPower changes the state from outside (a machine that crashes, or is unplugged).
func (s *system) setPower(state string) {
	s.mu.Lock()
	s.gen++
	n := s.setLocked(state)
	s.mu.Unlock()
	s.notify(n)
}

// setDead makes the power fail to come on (dead), or come on again (a new board).
func (s *system) setDead(dead bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = dead
}

// setLocked moves to state and returns the running-changes to report.
func (s *system) setLocked(state string) []bool {
	wasRunning := s.state == On || s.state == PoweringOff
	s.state = state
	if state == On {
		s.lastReset = time.Now().UTC()
	}
	if isRunning := state == On || state == PoweringOff; isRunning != wasRunning {
		return []bool{isRunning}
	}
	return nil
}

// powerOnLocked powers on after wait (off), spending PowerOnDelay in PoweringOn.
func (s *system) powerOnLocked(gen int, wait time.Duration) []bool {
	up := func() []bool {
		if s.dead {
			return nil
		}
		if s.cfg.PowerOnDelay <= 0 {
			return s.setLocked(On)
		}
		s.state = PoweringOn
		return s.afterLocked(gen, s.cfg.PowerOnDelay, func() []bool { return s.setLocked(On) })
	}
	return s.afterLocked(gen, wait, up)
}

// afterLocked runs f after d unless a newer request came in or the simulator closed. With d ≤ 0 it
// runs f now and returns its changes for the caller to report.
func (s *system) afterLocked(gen int, d time.Duration, f func() []bool) []bool {
	if d <= 0 {
		return f()
	}
	s.timers = append(s.timers, time.AfterFunc(d, func() {
		s.mu.Lock()
		if s.closed || s.gen != gen {
			s.mu.Unlock()
			return
		}
		n := f()
		s.mu.Unlock()
		s.notify(n)
	}))
	return nil
}

func (s *system) notify(changes []bool) {
	if s.hook == nil {
		return
	}
	for _, running := range changes {
		s.hook(s.cfg.ID, running)
	}
}

func (s *system) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, t := range s.timers {
		t.Stop()
	}
}

func (s *system) resetLog() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.resets)
}
