package bmcsim

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type hookLog struct {
	mu     sync.Mutex
	events []bool
}

func (h *hookLog) hook(_ string, running bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, running)
}

func (h *hookLog) get() []bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]bool(nil), h.events...)
}

func TestSystemTransitionsAndHook(t *testing.T) {
	tests := []struct {
		name       string
		cfg        SystemConfig
		dead       bool
		resets     []string
		wantState  string
		wantEvents []bool
	}{
		{name: "force off", cfg: SystemConfig{ID: "1"}, resets: []string{"ForceOff"}, wantState: Off, wantEvents: []bool{false}},
		{name: "graceful shutdown after its delay", cfg: SystemConfig{ID: "1", ShutdownDelay: 30 * time.Millisecond},
			resets: []string{"GracefulShutdown"}, wantState: Off, wantEvents: []bool{false}},
		{name: "power cycle", cfg: SystemConfig{ID: "1", CycleOffDuration: 20 * time.Millisecond},
			resets: []string{"PowerCycle"}, wantState: On, wantEvents: []bool{false, true}},
		{name: "warm reset restarts the machine, power stays On", cfg: SystemConfig{ID: "1"},
			resets: []string{"ForceRestart"}, wantState: On, wantEvents: []bool{false, true}},
		{name: "graceful restart", cfg: SystemConfig{ID: "1", ShutdownDelay: 20 * time.Millisecond, CycleOffDuration: 20 * time.Millisecond, PowerOnDelay: 20 * time.Millisecond},
			resets: []string{"GracefulRestart"}, wantState: On, wantEvents: []bool{false, true}},
		{name: "on from off through PoweringOn", cfg: SystemConfig{ID: "1", PowerState: Off, PowerOnDelay: 20 * time.Millisecond},
			resets: []string{"On"}, wantState: On, wantEvents: []bool{true}},
		{name: "on when on does nothing", cfg: SystemConfig{ID: "1"}, resets: []string{"On"}, wantState: On},
		{name: "a newer request cancels a pending transition", cfg: SystemConfig{ID: "1", ShutdownDelay: 50 * time.Millisecond},
			resets: []string{"GracefulShutdown", "ForceOff", "On"}, wantState: On, wantEvents: []bool{false, true}},
		{name: "a dead system's power cycle leaves it off", cfg: SystemConfig{ID: "1", CycleOffDuration: 20 * time.Millisecond}, dead: true,
			resets: []string{"PowerCycle"}, wantState: Off, wantEvents: []bool{false}},
		{name: "a dead system does not power on", cfg: SystemConfig{ID: "1", PowerState: Off}, dead: true,
			resets: []string{"On", "GracefulRestart", "ForceRestart"}, wantState: Off},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &hookLog{}
			s := newSystem(tt.cfg, h.hook)
			defer s.close()
			s.setDead(tt.dead)
			for _, r := range tt.resets {
				s.reset(r)
			}
			require.Eventually(t, func() bool { st, _ := s.snapshot(); return st == tt.wantState }, 2*time.Second, 5*time.Millisecond)
			time.Sleep(120 * time.Millisecond) // any stale timer would fire by now
			st, _ := s.snapshot()
			assert.Equal(t, tt.wantState, st)
			assert.Equal(t, tt.wantEvents, h.get())
			assert.Equal(t, tt.resets, s.resetLog())
		})
	}
}

func TestLastResetTimeMovesOnEveryReset(t *testing.T) {
	s := newSystem(SystemConfig{ID: "1"}, nil)
	defer s.close()
	_, before := s.snapshot()
	time.Sleep(2 * time.Millisecond)
	s.reset("ForceRestart")
	_, after := s.snapshot()
	assert.True(t, after.After(before))
}

func TestStartRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "bmcsim: Username and Password are required"},
		{Config{Username: "a", Password: "b", Systems: []SystemConfig{{ID: "x/y"}}}, `bmcsim: systems[0]: ID "x/y" must be non-empty without / ? #`},
		{Config{Username: "a", Password: "b", Systems: []SystemConfig{{ID: "1"}, {ID: "1"}}}, `bmcsim: systems[1]: ID "1" is used twice`},
		{Config{Username: "a", Password: "b", Systems: []SystemConfig{{ID: "1", PowerState: "Maybe"}}}, `bmcsim: systems[0]: PowerState "Maybe": want On or Off`},
	} {
		_, err := Start(tc.cfg)
		assert.EqualError(t, err, tc.want)
	}
}
