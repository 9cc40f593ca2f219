package hub

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// FuzzInventory loads fuzzer-made inventory files. It fails on a panic; on a result that differs
// between two loads of the same file (an error chosen by map order); on an error that does not name
// the file; and on an accepted inventory that breaks what the hub relies on: unique machine names,
// nodes and members, witnesses apart from machines, endpoints that read back the same, credentials,
// and a policy with positive limits and no negative duration.
func FuzzInventory(f *testing.F) {
	path := exampleInventory(f)
	example, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	for _, file := range []string{"fleet.yaml", "quorum-lost.yaml", "replace-in-flight.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "examples", file))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("cluster: c\nclasses: {a: {strategy: reboot}, b: {strategy: nope}, c: {strategy: nope}}\nmachines: []\n"))
	f.Add([]byte("cluster: c\npolicy: {probeTimeouts: {a: -1s, b: 0s}, cooldown: -1m}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		inv, err := LoadInventory(path)
		again, err2 := LoadInventory(path)
		switch {
		case (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() || !reflect.DeepEqual(inv, again):
			t.Fatalf("two loads of one file differ: %v / %v", err, err2)
		case err != nil && !strings.Contains(err.Error(), path):
			t.Fatalf("the error does not name the file: %v", err)
		case err != nil:
			return
		}
		checkInventory(t, inv)
	})
}

func checkInventory(t *testing.T, inv pass.Inventory) {
	t.Helper()
	if inv.Cluster == "" {
		t.Fatal("accepted without a cluster")
	}
	names, nodes, members := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, m := range inv.Machines {
		switch {
		case m.Name == "" || strings.Contains(m.Name, "/") || names[m.Name]:
			t.Fatalf("machine name %q: empty, with /, or twice", m.Name)
		case m.Node == "" || nodes[m.Node]:
			t.Fatalf("machine %s: node %q empty or another machine's", m.Name, m.Node)
		case m.Member != "" && members[m.Member]:
			t.Fatalf("machine %s: member %q is another machine's", m.Name, m.Member)
		case m.Pool == "":
			t.Fatalf("machine %s: no pool", m.Name)
		case m.Credentials.Username == "" || m.Credentials.Password() == "":
			t.Fatalf("machine %s: credentials without username or password", m.Name)
		}
		if s, err := quorum.ParseStrategy(m.Strategy.String()); err != nil || s != m.Strategy {
			t.Fatalf("machine %s: strategy %v does not read back: %v", m.Name, m.Strategy, err)
		}
		if ep, err := bmc.ParseEndpoint(m.Endpoint.String()); err != nil || ep != m.Endpoint {
			t.Fatalf("machine %s: endpoint %+v reads back as %+v (%v)", m.Name, m.Endpoint, ep, err)
		}
		names[m.Name], nodes[m.Node], members[m.Member] = true, true, m.Member != ""
	}
	for _, w := range inv.Witnesses {
		if w == "" || strings.ContainsAny(w, " /") || nodes[w] {
			t.Fatalf("witness %q: empty, with space or /, a machine's node or twice", w)
		}
		nodes[w] = true
	}
	p := inv.Policy
	if err := p.Quorum.Validate(); err != nil {
		t.Fatalf("accepted a quorum policy that does not validate: %v", err)
	}
	if p.RateMax <= 0 || p.MaxAttempts <= 0 {
		t.Fatalf("rate limit max %d, max attempts %d: must be positive", p.RateMax, p.MaxAttempts)
	}
	for name, d := range map[string]int64{"rateLimit.per": int64(p.RatePer), "cooldown": int64(p.Cooldown), "flapWindow": int64(p.FlapWindow),
		"deadTimeout": int64(p.Assess.DeadTimeout), "etcdUnreachableTimeout": int64(p.Assess.EtcdUnreachableTimeout), "staleAfter": int64(p.Assess.StaleAfter)} {
		if d < 0 {
			t.Fatalf("policy.%s: accepted negative", name)
		}
	}
	for probe, d := range p.Assess.ProbeTimeouts {
		if _, err := health.LookupProbe(probe); err != nil {
			t.Fatalf("policy.probeTimeouts.%s accepted: %v", probe, err)
		}
		if d <= 0 {
			t.Fatalf("policy.probeTimeouts.%s: %v accepted", probe, d)
		}
	}
	for cond, d := range p.Assess.NodeConditionTimeouts {
		if d <= 0 {
			t.Fatalf("policy.nodeConditionTimeouts.%s: %v accepted", cond, d)
		}
	}
}

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
			var e APIError
			if err := json.Unmarshal(raw, &e); err != nil || e.Error == "" {
				t.Fatalf("%s %q: %d with body %q, not an error", path, body, resp.StatusCode, raw)
			}
		}
		// What the API must take: one object of known fields, or (brakes) nothing, with by and reason
		// short and printable.
		var brake BrakeRequest
		var rb RebootRequest
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
		var st Status
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
