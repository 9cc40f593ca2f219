// Package bmcsim is a stateful Redfish BMC simulator for tests and the demo: a service root, a session
// service with real sessions, systems whose power state moves through timed transitions on
// ComputerSystem.Reset, managers and chassis; basic and session auth over HTTP or HTTPS (with a
// generated certificate); and faults on demand (slow answers, 500s, malformed JSON, rejected
// credentials, resets accepted but never carried out, no session service).
package bmcsim

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Config describes a simulated BMC.
type Config struct {
	// Addr to listen on (default 127.0.0.1:0).
	Addr string
	// Listener, when set, is used instead of listening on Addr (the chaos harness listens inside a
	// network namespace).
	Listener net.Listener
	// Username and Password are the one account it accepts.
	Username, Password string
	// Systems it manages (default: one system "1").
	Systems []SystemConfig
	// PlainHTTP serves HTTP instead of HTTPS.
	PlainHTTP bool
	// OnPower, when set, is called whenever a system starts or stops running (the demo ties it to a
	// simulated machine's processes). It is called outside the simulator's locks.
	OnPower func(systemID string, running bool)
	// OnRequest, when set, is called at the start of every request (benchmarks time the first BMC call
	// with it). It must not block.
	OnRequest func(r *http.Request)
	// ClockOffset is how far the BMC's clock is ahead of the real one (negative: behind): its log's
	// times and its DateTime are on it.
	ClockOffset time.Duration
}

// Faults are misbehaviours injected on demand.
type Faults struct {
	// Latency delays every answer.
	Latency time.Duration
	// Fail500 answers the next N requests (after the service root) with 500.
	Fail500 int
	// Malformed answers the next N GETs of a system with a truncated JSON body.
	Malformed int
	// RejectAuth rejects every login and every authenticated request (as if the password had changed).
	RejectAuth bool
	// IgnoreResets accepts resets (204) but never changes the power state.
	IgnoreResets bool
	// NoSessionService answers 404 for the session service, so clients must fall back to basic auth.
	NoSessionService bool
	// EndSessions ends every open session at each of the next N requests made in one, which is
	// answered 401 NoValidSession: what a BMC does when a session times out, its manager resets, or a
	// new login evicts the oldest session past the BMC's limit. The credentials still work.
	EndSessions int
}

// Server is a running simulated BMC.
type Server struct {
	cfg     Config
	ln      net.Listener
	srv     *http.Server
	certPEM []byte
	systems map[string]*system
	order   []string

	mu       sync.Mutex
	faults   Faults
	sessions map[string]string // token → session ID
	nextID   int
	requests int
	failed   int // logins and basic-auth requests with wrong credentials
	done     chan struct{}
}

// Start starts a simulated BMC. Close stops it.
func Start(cfg Config) (*Server, error) {
	if cfg.Username == "" || cfg.Password == "" {
		return nil, errors.New("bmcsim: Username and Password are required")
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if len(cfg.Systems) == 0 {
		cfg.Systems = []SystemConfig{{ID: "1"}}
	}
	s := &Server{cfg: cfg, systems: map[string]*system{}, sessions: map[string]string{}, done: make(chan struct{})}
	for i, sc := range cfg.Systems {
		if sc.ID == "" || strings.ContainsAny(sc.ID, "/?#") {
			return nil, fmt.Errorf("bmcsim: systems[%d]: ID %q must be non-empty without / ? #", i, sc.ID)
		}
		if _, dup := s.systems[sc.ID]; dup {
			return nil, fmt.Errorf("bmcsim: systems[%d]: ID %q is used twice", i, sc.ID)
		}
		if sc.PowerState != "" && sc.PowerState != On && sc.PowerState != Off {
			return nil, fmt.Errorf("bmcsim: systems[%d]: PowerState %q: want On or Off", i, sc.PowerState)
		}
		s.systems[sc.ID] = newSystem(sc, cfg.OnPower)
		s.order = append(s.order, sc.ID)
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, fmt.Errorf("bmcsim: listen on %s: %w", cfg.Addr, err)
		}
	}
	if !cfg.PlainHTTP {
		cert, certPEM, err := selfSigned()
		if err != nil {
			ln.Close()
			return nil, err
		}
		s.certPEM = certPEM
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}
	s.ln = ln
	// Handshake failures from clients that do not trust the generated certificate are expected.
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Close stops the server and every pending power transition.
func (s *Server) Close() error {
	s.mu.Lock()
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	s.mu.Unlock()
	for _, sys := range s.systems {
		sys.close()
	}
	return s.srv.Close()
}

// Addr is the host:port it listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Endpoint is the address to give Hale: redfish://host:port (redfish+http:// for plain HTTP).
func (s *Server) Endpoint() string {
	if s.cfg.PlainHTTP {
		return "redfish+http://" + s.Addr()
	}
	return "redfish://" + s.Addr()
}

// URL is the service's HTTP(S) base URL.
func (s *Server) URL() string {
	if s.cfg.PlainHTTP {
		return "http://" + s.Addr()
	}
	return "https://" + s.Addr()
}

// CertPEM is the server's self-signed certificate (its own CA), nil for plain HTTP.
func (s *Server) CertPEM() []byte { return s.certPEM }

// SetFaults replaces the injected faults.
func (s *Server) SetFaults(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
}

// PowerState returns a system's power state.
func (s *Server) PowerState(id string) string {
	st, _ := s.system(id).snapshot()
	return st
}

// SetPowerState changes a system's power from outside (a crash, a pulled plug).
func (s *Server) SetPowerState(id, state string) { s.system(id).setPower(state) }

// SetDead makes a system's power fail to come on, as a failed power supply or board does: resets
// that would power it on are accepted and leave it Off (dead false: a new board, working again). Its
// power stays as it is until a reset changes it.
func (s *Server) SetDead(id string, dead bool) { s.system(id).setDead(dead) }

// Resets returns the reset types a system accepted, in order (ignored ones included).
func (s *Server) Resets(id string) []string { return s.system(id).resetLog() }

// Requests counts the HTTP requests served.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Sessions counts the open sessions.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

func (s *Server) system(id string) *system {
	sys, ok := s.systems[id]
	if !ok {
		panic("bmcsim: no system " + id)
	}
	return sys
}

// ServeHTTP routes a Redfish request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.cfg.OnRequest != nil {
		s.cfg.OnRequest(r)
	}
	s.mu.Lock()
	s.requests++
	f := s.faults
	path := strings.TrimSuffix(r.URL.Path, "/")
	isRoot := path == "/redfish" || path == "/redfish/v1"
	fail := !isRoot && s.faults.Fail500 > 0
	if fail {
		s.faults.Fail500--
	}
	s.mu.Unlock()

	if f.Latency > 0 {
		select {
		case <-time.After(f.Latency):
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		}
	}
	if fail {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", "injected fault: internal error")
		return
	}
	switch {
	case path == "/redfish":
		writeJSON(w, http.StatusOK, map[string]any{"v1": "/redfish/v1/"})
		return
	case path == "/redfish/v1":
		s.serviceRoot(w, f)
		return
	case path == "/redfish/v1/SessionService/Sessions" && r.Method == http.MethodPost:
		if f.NoSessionService {
			writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no session service")
			return
		}
		s.login(w, r, f)
		return
	}
	if !s.authorized(r, f) {
		w.Header().Set("WWW-Authenticate", `Basic realm="bmcsim"`)
		writeError(w, http.StatusUnauthorized, "Base.1.8.NoValidSession", "authentication required")
		return
	}
	s.route(w, r, path, f)
}

func (s *Server) route(w http.ResponseWriter, r *http.Request, path string, f Faults) {
	const sys = "/redfish/v1/Systems/"
	switch {
	case strings.HasPrefix(path, "/redfish/v1/SessionService") && f.NoSessionService:
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no session service")
	case path == "/redfish/v1/SessionService":
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": "/redfish/v1/SessionService", "@odata.type": "#SessionService.v1_1_8.SessionService",
			"Id": "SessionService", "Name": "Session Service", "ServiceEnabled": true, "SessionTimeout": 1800,
			"Sessions": odataID("/redfish/v1/SessionService/Sessions"),
		})
	case path == "/redfish/v1/SessionService/Sessions":
		s.mu.Lock()
		var ids []string
		for _, id := range s.sessions {
			ids = append(ids, "/redfish/v1/SessionService/Sessions/"+id)
		}
		s.mu.Unlock()
		slices.Sort(ids)
		writeJSON(w, http.StatusOK, collection("/redfish/v1/SessionService/Sessions", "#SessionCollection.SessionCollection", "Sessions", ids))
	case strings.HasPrefix(path, "/redfish/v1/SessionService/Sessions/"):
		s.session(w, r, strings.TrimPrefix(path, "/redfish/v1/SessionService/Sessions/"))
	case path == "/redfish/v1/Systems":
		writeJSON(w, http.StatusOK, collection("/redfish/v1/Systems", "#ComputerSystemCollection.ComputerSystemCollection",
			"Computer System Collection", s.paths(sys)))
	case strings.HasPrefix(path, sys):
		s.systemResource(w, r, strings.TrimPrefix(path, sys), f)
	case path == "/redfish/v1/Managers":
		writeJSON(w, http.StatusOK, collection("/redfish/v1/Managers", "#ManagerCollection.ManagerCollection", "Manager Collection",
			[]string{"/redfish/v1/Managers/BMC"}))
	case path == "/redfish/v1/Managers/BMC":
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": "/redfish/v1/Managers/BMC", "@odata.type": "#Manager.v1_10_0.Manager", "Id": "BMC", "Name": "Simulated BMC",
			"ManagerType": "BMC", "FirmwareVersion": "hale-bmcsim", "Status": status(),
			"Links": map[string]any{"ManagerForServers": refs(s.paths(sys)), "ManagerForChassis": refs(s.paths("/redfish/v1/Chassis/"))},
		})
	case path == "/redfish/v1/Chassis":
		writeJSON(w, http.StatusOK, collection("/redfish/v1/Chassis", "#ChassisCollection.ChassisCollection", "Chassis Collection",
			s.paths("/redfish/v1/Chassis/")))
	case strings.HasPrefix(path, "/redfish/v1/Chassis/"):
		id := strings.TrimPrefix(path, "/redfish/v1/Chassis/")
		sy, ok := s.systems[id]
		if !ok {
			writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no chassis "+id)
			return
		}
		st, _ := sy.snapshot()
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": path, "@odata.type": "#Chassis.v1_14_0.Chassis", "Id": id, "Name": "Chassis " + id,
			"ChassisType": "RackMount", "PowerState": st, "Status": status(),
			"Links": map[string]any{"ComputerSystems": refs([]string{sys + id}), "ManagedBy": refs([]string{"/redfish/v1/Managers/BMC"})},
		})
	default:
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no resource at "+path)
	}
}

func (s *Server) paths(prefix string) []string {
	out := make([]string, len(s.order))
	for i, id := range s.order {
		out[i] = prefix + id
	}
	return out
}

func (s *Server) serviceRoot(w http.ResponseWriter, f Faults) {
	root := map[string]any{
		"@odata.id": "/redfish/v1/", "@odata.type": "#ServiceRoot.v1_11_0.ServiceRoot",
		"Id": "RootService", "Name": "Hale simulated BMC", "RedfishVersion": "1.11.0",
		"UUID":     "8d7a4c1e-0000-4000-8000-000000000001",
		"Systems":  odataID("/redfish/v1/Systems"),
		"Managers": odataID("/redfish/v1/Managers"),
		"Chassis":  odataID("/redfish/v1/Chassis"),
	}
	if !f.NoSessionService {
		root["SessionService"] = odataID("/redfish/v1/SessionService")
		root["Links"] = map[string]any{"Sessions": odataID("/redfish/v1/SessionService/Sessions")}
	}
	writeJSON(w, http.StatusOK, root)
}

func (s *Server) systemResource(w http.ResponseWriter, r *http.Request, rest string, f Faults) {
	id, action, _ := strings.Cut(rest, "/")
	sy, ok := s.systems[id]
	if !ok {
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no system "+id)
		return
	}
	switch {
	case action == "" && r.Method == http.MethodGet:
		s.mu.Lock()
		garble := s.faults.Malformed > 0
		if garble {
			s.faults.Malformed--
		}
		s.mu.Unlock()
		if garble {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte(`{"@odata.id": "/redfish/v1/Systems/` + id + `", "PowerState": "O`))
			return
		}
		writeJSON(w, http.StatusOK, s.systemJSON(id, sy))
	case action == "Actions/ComputerSystem.Reset" && r.Method == http.MethodPost:
		var body struct{ ResetType string }
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&body); err != nil {
			writeError(w, http.StatusBadRequest, "Base.1.8.MalformedJSON", "the request body is not valid JSON")
			return
		}
		if !sy.allows(body.ResetType) {
			writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterValueNotInList",
				fmt.Sprintf("ResetType %q is not one of %v", body.ResetType, sy.cfg.ResetTypes))
			return
		}
		if f.IgnoreResets {
			sy.mu.Lock()
			sy.resets = append(sy.resets, body.ResetType+" (ignored)")
			sy.mu.Unlock()
		} else {
			sy.reset(body.ResetType)
		}
		w.WriteHeader(http.StatusNoContent)
	case strings.HasPrefix(action, "LogServices"):
		s.logResource(w, r, id, sy, action)
	default:
		writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", r.Method+" is not allowed on "+r.URL.Path)
	}
}

func (s *Server) systemJSON(id string, sy *system) map[string]any {
	st, lastReset := sy.snapshot()
	reset := map[string]any{"target": "/redfish/v1/Systems/" + id + "/Actions/ComputerSystem.Reset"}
	if !sy.cfg.OmitAllowableValues {
		reset["ResetType@Redfish.AllowableValues"] = sy.cfg.ResetTypes
	}
	out := map[string]any{
		"@odata.id": "/redfish/v1/Systems/" + id, "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
		"Id": id, "Name": "System " + id, "SystemType": "Physical", "Manufacturer": "Hale", "Model": "bmcsim",
		"SerialNumber": "SIM-" + id, "UUID": fmt.Sprintf("8d7a4c1e-0000-4000-8000-%012x", len(id)*7919+int(id[0])),
		"PowerState": st, "Status": map[string]string{"State": "Enabled", "Health": sy.healthNow()},
		"LogServices": odataID("/redfish/v1/Systems/" + id + "/LogServices"),
		"Boot": map[string]any{
			"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None", "BootSourceOverrideMode": "UEFI",
			"BootSourceOverrideTarget@Redfish.AllowableValues": []string{"None", "Pxe", "Hdd", "Cd", "BiosSetup"},
		},
		"Actions": map[string]any{"#ComputerSystem.Reset": reset},
		"Links": map[string]any{
			"Chassis":   refs([]string{"/redfish/v1/Chassis/" + id}),
			"ManagedBy": refs([]string{"/redfish/v1/Managers/BMC"}),
		},
	}
	if !sy.cfg.OmitLastResetTime {
		out["LastResetTime"] = lastReset.Format(time.RFC3339Nano)
	}
	return out
}
