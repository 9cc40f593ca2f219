package hub

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
)

// FuzzAPIBodies posts fuzzer-made bodies to each operator API endpoint that takes one, on a hub with
// three healthy machines (not running passes: nothing is acted on). It fails when the answer is a 500,
// is not JSON, or is an error without text; when a body that is not exactly one object of the
// request's known fields (or, for brakes, nothing) is not a 400, or one that is, with sane text, is;
// and when a brake that was taken does not show who asked and why as sent.
func FuzzAPIBodies(f *testing.F) {
	paths := []string{"/v1/pause", "/v1/resume", "/v1/suspend", "/v1/unsuspend", "/v1/machines/cp-1/detach",
		"/v1/machines/cp-1/attach", "/v1/machines/nosuch/reboot"}
	for i, body := range []string{"", `{"by":"alice","reason":"maintenance"}`, `{"by":"alice"} {"by":"mallory"}`, `{"by":"a\nb"}`,
		`{"reason":"x","extra":1}`, `{"hard":true,"dryRun":true}`, `null`, `{"by":"bob"}`} {
		f.Add(uint8(i), []byte(body))
	}
	r := newPassRig(f, newTestPool(3), testPolicy(), nil)
	api := httptest.NewServer(r.hub.APIHandler(""))
	f.Cleanup(api.Close)
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		path := paths[int(which)%len(paths)]
		reboot := strings.HasSuffix(path, "/reboot")
		// A brake already on keeps who took it first: lift it, so this body's by and reason must show.
		switch path {
		case "/v1/pause":
			require.NoError(t, r.hub.SetPaused(t.Context(), false, "fuzz", ""))
		case "/v1/suspend":
			require.NoError(t, r.hub.SetSuspended(t.Context(), false, "fuzz", ""))
		}
		resp, err := http.Post(api.URL+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode >= 500 {
			t.Fatalf("%s %q: %d %s", path, body, resp.StatusCode, raw)
		}
		if resp.StatusCode != http.StatusOK {
			var e operator.APIError
			if err := json.Unmarshal(raw, &e); err != nil || e.Error == "" {
				t.Fatalf("%s %q: %d with body %q, not an error", path, body, resp.StatusCode, raw)
			}
		}
		// What the API must take: one object of known fields, or (brakes) nothing, with by and reason
		// short and printable.
		var brake operator.BrakeRequest
		var rb operator.RebootRequest
		var target any = &brake
		if reboot {
			target = &rb
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		err = dec.Decode(target)
		valid := err == nil && len(body) <= maxBody
		if valid {
			_, err := dec.Token()
			valid = errors.Is(err, io.EOF)
		} else if errors.Is(err, io.EOF) && !reboot {
			valid = true
		}
		sane := func(s string, limit int) bool {
			return len(s) <= limit && !strings.ContainsFunc(s, unicode.IsControl)
		}
		valid = valid && sane(brake.By, maxBy) && sane(brake.Reason, maxReason) && sane(rb.By, maxBy) &&
			!(reboot && rb.Machine != "" && rb.Machine != "nosuch")
		if valid != (resp.StatusCode != http.StatusBadRequest) {
			t.Fatalf("%s %q: %d %s (body valid: %v)", path, body, resp.StatusCode, raw, valid)
		}
		// Pause and suspend show who took the brake and why (detach is per machine, in its own view).
		if resp.StatusCode != http.StatusOK || path != "/v1/pause" && path != "/v1/suspend" {
			return
		}
		var st operator.Status
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatalf("%s: status %q: %v", path, raw, err)
		}
		want := pass.Brake{By: cmp.Or(brake.By, pass.Operator), Reason: brake.Reason}
		got := st.PausedBy
		if path == "/v1/suspend" {
			got = nil
			if st.SuspendedBy != nil {
				got = []pass.Brake{*st.SuspendedBy}
			}
		}
		if !slices.ContainsFunc(got, func(b pass.Brake) bool { return b.By == want.By && b.Reason == want.Reason }) {
			t.Fatalf("%s %q: status shows %+v, want by %q reason %q", path, body, got, want.By, want.Reason)
		}
	})
}
