package bmc

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const (
	fuzzRoot       = `{"@odata.id":"/redfish/v1/","Id":"RootService","RedfishVersion":"1.11.0","Systems":{"@odata.id":"/redfish/v1/Systems"}}`
	fuzzCollection = `{"@odata.id":"/redfish/v1/Systems","Members":[{"@odata.id":"/redfish/v1/Systems/1"}],"Members@odata.count":1}`
	fuzzSystem     = `{"@odata.id":"/redfish/v1/Systems/1","Id":"1","PowerState":"On","LastResetTime":"2026-11-22T03:00:00Z",` +
		`"Actions":{"#ComputerSystem.Reset":{"target":"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset","ResetType@Redfish.AllowableValues":["On","ForceOff"]}}}`
)

// FuzzRedfishResponses serves fuzzer-made bodies for the service root, the systems collection and a
// system, and reads the power state through the Redfish driver: malformed answers must give errors,
// never panics, and a success must be a known power state.
func FuzzRedfishResponses(f *testing.F) {
	f.Add([]byte(fuzzRoot), []byte(fuzzCollection), []byte(fuzzSystem))
	f.Add([]byte(fuzzRoot), []byte(fuzzCollection), []byte(`{"PowerState": "O`))
	f.Add([]byte(fuzzRoot), []byte(`{"Members":[{"@odata.id":"/redfish/v1/Systems/1"},{"@odata.id":7}]}`), []byte(fuzzSystem))
	f.Add([]byte(`{"Systems":"nope"}`), []byte(fuzzCollection), []byte(fuzzSystem))
	f.Add([]byte(fuzzRoot), []byte(fuzzCollection), []byte(`{"PowerState":null,"Actions":{"#ComputerSystem.Reset":7}}`))
	f.Add([]byte(fuzzRoot), []byte(`{"Members":null}`), []byte(`[]`))
	f.Fuzz(func(t *testing.T, root, coll, sys []byte) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			switch strings.TrimSuffix(r.URL.Path, "/") {
			case "/redfish/v1":
				_, _ = w.Write(root)
			case "/redfish/v1/Systems":
				_, _ = w.Write(coll)
			case "/redfish/v1/Systems/1":
				_, _ = w.Write(sys)
			default:
				w.WriteHeader(http.StatusNotFound)
			}
		}))
		defer srv.Close()
		ep, err := ParseEndpoint("redfish+http://" + strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(ep, NewCredentials("u", "p"), Options{Retries: -1, VerifyTimeout: 50 * time.Millisecond,
			GracefulTimeout: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := c.PowerState(ctx)
		if err == nil {
			switch st {
			case PowerOn, PowerOff, PowerPoweringOn, PowerPoweringOff, PowerUnknown:
			default:
				t.Fatalf("power state %q", st)
			}
		}
		_, _ = c.PowerOff(ctx)
	})
}
