package bmcsim

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
)

func (s *Server) login(w http.ResponseWriter, r *http.Request, f Faults) {
	var body struct{ UserName, Password string }
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.MalformedJSON", "the request body is not valid JSON")
		return
	}
	if f.RejectAuth || !s.credentialsMatch(body.UserName, body.Password) {
		s.mu.Lock()
		s.failed++
		s.mu.Unlock()
		writeError(w, http.StatusUnauthorized, "Base.1.8.ResourceAtUriUnauthorized", "invalid user name or password")
		return
	}
	buf := make([]byte, 16)
	_, _ = rand.Read(buf)
	token := hex.EncodeToString(buf)
	s.mu.Lock()
	s.nextID++
	id := strconv.Itoa(s.nextID)
	s.sessions[token] = id
	s.mu.Unlock()
	loc := "/redfish/v1/SessionService/Sessions/" + id
	w.Header().Set("X-Auth-Token", token)
	w.Header().Set("Location", loc)
	writeJSON(w, http.StatusCreated, map[string]any{
		"@odata.id": loc, "@odata.type": "#Session.v1_3_0.Session", "Id": id, "Name": "Session " + id, "UserName": body.UserName,
	})
}

func (s *Server) session(w http.ResponseWriter, r *http.Request, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for token, sid := range s.sessions {
		if sid != id {
			continue
		}
		if r.Method == http.MethodDelete {
			delete(s.sessions, token)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": "/redfish/v1/SessionService/Sessions/" + id, "@odata.type": "#Session.v1_3_0.Session",
			"Id": id, "Name": "Session " + id, "UserName": s.cfg.Username,
		})
		return
	}
	writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no session "+id)
}

func (s *Server) credentialsMatch(user, pass string) bool {
	u := subtle.ConstantTimeCompare([]byte(user), []byte(s.cfg.Username))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(s.cfg.Password))
	return u&p == 1
}

func (s *Server) authorized(r *http.Request, f Faults) bool {
	if f.RejectAuth {
		return false
	}
	if token := r.Header.Get("X-Auth-Token"); token != "" {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.faults.EndSessions > 0 {
			s.faults.EndSessions--
			clear(s.sessions)
		}
		_, ok := s.sessions[token]
		return ok
	}
	user, pass, ok := r.BasicAuth()
	if ok && !s.credentialsMatch(user, pass) {
		s.mu.Lock()
		s.failed++ // a real BMC counts this against the account's lockout threshold
		s.mu.Unlock()
		return false
	}
	return ok
}

// FailedLogins counts the logins and basic-auth requests made with wrong credentials: what a real
// BMC counts towards locking the account.
func (s *Server) FailedLogins() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}
