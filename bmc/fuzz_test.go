package bmc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stmcginnis/gofish/redfish"
)

const (
	fuzzRoot       = `{"@odata.id":"/redfish/v1/","Id":"RootService","RedfishVersion":"1.11.0","Systems":{"@odata.id":"/redfish/v1/Systems"}}`
	fuzzCollection = `{"@odata.id":"/redfish/v1/Systems","Members":[{"@odata.id":"/redfish/v1/Systems/1"}],"Members@odata.count":1}`
	fuzzSystem     = `{"@odata.id":"/redfish/v1/Systems/1","Id":"1","PowerState":"On","LastResetTime":"2026-11-22T03:00:00Z",` +
		`"Actions":{"#ComputerSystem.Reset":{"target":"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset","ResetType@Redfish.AllowableValues":["On","ForceOff"]}}}`
)

// fuzzBMC serves the bodies of the current fuzz input: one server for the whole run, so that an
// execution costs the driver's requests, not a listener.
type fuzzBMC struct {
	mu              sync.Mutex
	root, coll, sys []byte
}

func (b *fuzzBMC) set(root, coll, sys []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.root, b.coll, b.sys = root, coll, sys
}

func (b *fuzzBMC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch strings.TrimSuffix(r.URL.Path, "/") {
	case "/redfish/v1":
		_, _ = w.Write(b.root)
	case "/redfish/v1/Systems":
		_, _ = w.Write(b.coll)
	case "/redfish/v1/Systems/1":
		_, _ = w.Write(b.sys)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// redfishPowerStates are the values of Redfish's PowerState enum and what each must read as.
var redfishPowerStates = map[string]PowerState{"On": PowerOn, "Off": PowerOff, "PoweringOn": PowerPoweringOn,
	"PoweringOff": PowerPoweringOff, "Paused": PowerUnknown}

// FuzzRedfishResponses serves fuzzer-made bodies for the service root, the systems collection and a
// system, and reads the power state through the Redfish driver, then asks for power off. It fails on:
// a panic in the driver (recovered in production, a bug all the same); an error that does not name
// the endpoint or is not classified; and, when root and collection are well formed and the system
// body is one gofish can read (at the address it gives itself), any error, or a power state other than the body's.
func FuzzRedfishResponses(f *testing.F) {
	f.Add([]byte(fuzzRoot), []byte(fuzzCollection), []byte(fuzzSystem))
	f.Add([]byte(fuzzRoot), []byte(fuzzCollection), []byte(`{"PowerState": "O`))
	f.Add([]byte(fuzzRoot), []byte(fuzzCollection), []byte(`{"@odata.id":"/redfish/v1/Systems/1","PowerState":"PoweringOff"}`))
	f.Add([]byte(fuzzRoot), []byte(fuzzCollection), []byte(`{"@odata.id":"/redfish/v1/Systems/1","PowerState":" off "}`))
	f.Add([]byte(fuzzRoot), []byte(`{"Members":[{"@odata.id":"/redfish/v1/Systems/1"},{"@odata.id":7}]}`), []byte(fuzzSystem))
	f.Add([]byte(`{"Systems":"nope"}`), []byte(fuzzCollection), []byte(fuzzSystem))
	f.Add([]byte(fuzzRoot), []byte(fuzzCollection), []byte(`{"PowerState":null,"Actions":{"#ComputerSystem.Reset":7}}`))
	f.Add([]byte(fuzzRoot), []byte(`{"Members":null}`), []byte(`[]`))
	// A system whose LogServices, log service and entries are all the collection's and the system's
	// bodies: the event log's reading gets the fuzzer's bodies too.
	f.Add([]byte(fuzzRoot), []byte(`{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}],"DateTime":"2026-12-02T03:00:00Z",`+
		`"Entries":{"@odata.id":"/redfish/v1/Systems"},"Members@odata.nextLink":"/redfish/v1/Systems"}`),
		[]byte(`{"@odata.id":"/redfish/v1/Systems/1","PowerState":"On","Status":{"Health":"Critical"},"LogServices":{"@odata.id":"/redfish/v1/Systems"},`+
			`"SensorType":"OS Stop/Shutdown","Message":"Run-time critical stop","Created":"2026-12-02T03:00:00Z"}`))
	bmc := &fuzzBMC{}
	srv := httptest.NewServer(bmc)
	f.Cleanup(srv.Close)
	ep, err := ParseEndpoint("redfish+http://" + strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		f.Fatal(err)
	}
	// One controller (it keeps nothing between calls but its HTTP connections): a new one per
	// execution would leave thousands of connections a second in TIME_WAIT and stall the run.
	c, err := New(ep, NewCredentials("u", "p"), Options{Retries: -1, VerifyTimeout: 50 * time.Millisecond,
		GracefulTimeout: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, root, coll, sys []byte) {
		bmc.set(root, coll, sys)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := c.PowerState(ctx)
		checkFuzzError(t, ep, "power status", err)
		if string(root) == fuzzRoot && string(coll) == fuzzCollection {
			var gofishReads redfish.ComputerSystem
			var body struct{ PowerState json.RawMessage }
			// The system must say it lives where the collection links it (the driver reads it again
			// there); a body naming another place gets a 404 and an error, checked above.
			if json.Unmarshal(sys, &gofishReads) == nil && json.Unmarshal(sys, &body) == nil &&
				strings.TrimSuffix(gofishReads.ODataID, "/") == "/redfish/v1/Systems/1" {
				// Out of time is not the body's fault: a fuzzing worker on a busy machine can be
				// starved for the 2 s (the short fuzz runs share the machine with the test rigs).
				if err != nil && ctx.Err() == nil {
					t.Fatalf("a system body gofish reads gave an error: %v", err)
				}
				var s string
				_ = json.Unmarshal(body.PowerState, &s)
				want := PowerUnknown
				for name, state := range redfishPowerStates {
					if strings.EqualFold(strings.TrimSpace(s), name) {
						want = state
					}
				}
				if err == nil && st != want {
					t.Fatalf("PowerState %s read as %q, want %q", body.PowerState, st, want)
				}
			}
		}
		if err == nil {
			switch st {
			case PowerOn, PowerOff, PowerPoweringOn, PowerPoweringOff, PowerUnknown:
			default:
				t.Fatalf("power state %q", st)
			}
		}
		_, err = c.Evidence(ctx)
		checkFuzzError(t, ep, "evidence", err)
		_, err = c.PowerOff(ctx)
		checkFuzzError(t, ep, "power off", err)
	})
}

func checkFuzzError(t *testing.T, ep Endpoint, call string, err error) {
	t.Helper()
	switch {
	case err == nil:
	case errors.Is(err, errDriverPanic):
		t.Fatalf("%s: the driver panicked: %v", call, err)
	case !strings.Contains(err.Error(), ep.String()):
		t.Fatalf("%s: the error does not name the endpoint %s: %v", call, ep, err)
	case !errors.Is(err, ErrRefused) && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrUnverified):
		t.Fatalf("%s: the error is not classified (refused, auth, unverified): %v", call, err)
	}
}

// FuzzCredentialsFile loads fuzzer-made credential files. It fails on a panic, on an error that does
// not name the file, on an error that shows a line's secret part (what follows =, or a line that is
// not username=/password=: a password alone on its line), and on accepted credentials that are empty
// or differ from the file's last username= and password= lines.
func FuzzCredentialsFile(f *testing.F) {
	f.Add([]byte("# bmc\nusername = admin\npassword=a=b c\n"))
	f.Add([]byte("username=admin\nhunter2-is-my-password\n"))
	f.Add([]byte("username=admin\nS3cret=Passw0rd\n"))
	f.Add([]byte("Username=admin\npassword=x\n"))
	f.Add([]byte("username=\npassword=\n"))
	dir := f.TempDir()
	path := filepath.Join(dir, "credentials")
	// The messages' own text, to tell a secret shown from a secret that happens to be a message word.
	var template strings.Builder
	for _, body := range []string{"x", "x=y", "", "Username=x"} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			f.Fatal(err)
		}
		_, err := LoadCredentials(path)
		template.WriteString(err.Error())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := LoadCredentials(path)
		var user, password string
		var secrets []string
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			key, value, ok := strings.Cut(line, "=")
			switch key = strings.TrimSpace(key); {
			case line == "" || strings.HasPrefix(line, "#"):
			case ok && key == "username":
				user = strings.TrimSpace(value)
			case ok && key == "password":
				password = value
				secrets = append(secrets, strings.TrimSpace(value))
			default:
				secrets = append(secrets, line, strings.TrimSpace(value))
			}
		}
		if err != nil {
			msg := strings.ReplaceAll(err.Error(), path, "")
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("the error does not name the file: %v", err)
			}
			for _, s := range secrets {
				if len(s) >= 4 && strings.Contains(msg, s) && !strings.Contains(template.String(), s) {
					t.Fatalf("the error shows %q from the file: %v", s, err)
				}
			}
			return
		}
		if c.Username == "" || c.Password() == "" || c.Username != user || c.Password() != password {
			t.Fatalf("read user %q password %q, the file says %q %q", c.Username, c.Password(), user, password)
		}
	})
}
