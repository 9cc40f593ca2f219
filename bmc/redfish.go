package bmc

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/common"
	"github.com/stmcginnis/gofish/redfish"
)

// redfishDriver speaks Redfish through gofish: a session per operation (basic auth when the service
// has no session service), TLS verified unless Insecure.
type redfishDriver struct {
	ep      Endpoint
	creds   Credentials
	http    *http.Client
	timeout time.Duration
}

func newRedfishDriver(ep Endpoint, creds Credentials, opts Options) (driver, error) {
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: opts.Insecure} //nolint:gosec // only when asked for
	if opts.CAFile != "" {
		pem, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("BMC CA bundle: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("BMC CA bundle %s: no PEM certificate in it", opts.CAFile)
		}
		tlsConf.RootCAs = pool
	}
	transport := &http.Transport{
		TLSClientConfig:       tlsConf,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		MaxIdleConnsPerHost:   1,
		IdleConnTimeout:       30 * time.Second,
	}
	return &redfishDriver{ep: ep, creds: creds, timeout: opts.RequestTimeout,
		http: &http.Client{Transport: keepAlive{transport}, Timeout: opts.RequestTimeout}}, nil
}

// keepAlive undoes gofish's Connection: close. gofish keeps connections only with an HTTP client it
// builds itself; with ours (TLS settings, timeouts) it marks every request Close, so each request of
// an operation (root, session, systems, reads, reset, the polls) paid a TCP and TLS handshake: slow
// BMCs take hundreds of milliseconds for one. One idle connection per BMC is kept, for 30 s.
type keepAlive struct{ inner http.RoundTripper }

func (k keepAlive) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Close {
		r = r.Clone(r.Context())
		r.Close = false
		r.Header.Del("Connection")
	}
	return k.inner.RoundTrip(r)
}

func (d *redfishDriver) name() string { return DriverRedfish }

func (d *redfishDriver) open(ctx context.Context) (conn, error) {
	cfg := gofish.ClientConfig{
		Endpoint:   d.ep.BaseURL(),
		Username:   d.creds.Username,
		Password:   d.creds.Password(),
		HTTPClient: d.http,
	}
	client, err := gofish.ConnectContext(ctx, cfg)
	if err != nil && unreachable(err, d.timeout) == "" && classifyRedfish(err) == classRefused {
		// No usable session service (404, 405, 501, no Sessions link): fall back to basic auth. A BMC
		// that did not answer at all is not asked again (that doubled every attempt's time).
		cfg.BasicAuth = true
		client, err = gofish.ConnectContext(ctx, cfg)
	}
	if err != nil {
		return nil, wrapRedfish(ctx, "connect", err, d.timeout)
	}
	c := &redfishConn{client: client, cfg: cfg, timeout: d.timeout, ctx: ctx}
	if err := c.pickSystem(d.ep.SystemID); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

type redfishConn struct {
	client  *gofish.APIClient
	system  *redfish.ComputerSystem
	timeout time.Duration
	// ctx is the one the session was opened with, which gofish's requests go under.
	ctx context.Context
	// cfg logs in again when the BMC ends the session (inSession).
	cfg gofish.ClientConfig
}

// inSession runs f, a request made in the conn's session, and once more in a new session when the
// BMC answered it 401: the session ended (it timed out, the BMC's manager reset, or a login past the
// BMC's session limit evicted it), which says nothing of the credentials: they logged in. Counted
// as a refused login, it would hold every machine behind the account for minutes. The new login is
// one like any (refused, it is ErrAuth); a request the BMC answers 401 again right after it is
// refused, not retried: the account logs in but may not do this. A request answered 401 was not
// carried out, so a reset asked again is made once.
func (c *redfishConn) inSession(what string, f func() error) error {
	err := f()
	if err != nil && !c.cfg.BasicAuth && unauthorized(err) {
		client, lerr := gofish.ConnectContext(c.ctx, c.cfg)
		if lerr != nil {
			return wrapRedfish(c.ctx, what+": the BMC ended the session; logging in again", lerr, c.timeout)
		}
		c.client.Logout() // (the session has ended: this frees the connection)
		c.client = client
		if c.system != nil {
			c.system.SetClient(client)
		}
		if err = f(); err != nil && unauthorized(err) {
			return refused(fmt.Errorf("%s: %w (in a session opened just before: the account logs in, but the BMC refuses it this request)", what, answerOf(err)))
		}
	}
	return c.wrap(what, err)
}

// wrap is wrapRedfish for a request of the conn ("" when err is nil).
func (c *redfishConn) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return wrapRedfish(c.ctx, what, err, c.timeout)
}

func (c *redfishConn) pickSystem(id string) error {
	var systems []*redfish.ComputerSystem
	if err := c.inSession("list systems", func() (err error) {
		systems, err = c.systems()
		return err
	}); err != nil {
		return err
	}
	ids := make([]string, len(systems))
	for i, s := range systems {
		ids[i] = s.ID
		if id != "" && s.ID == id {
			c.system = s
		}
	}
	slices.Sort(ids) // gofish fetches members concurrently: their order varies
	switch {
	case c.system != nil:
		return nil
	case id != "":
		return refused(&marked{[]error{ErrNoSystem}, fmt.Sprintf("no system %q; the BMC has %s", id, describeIDs(ids))})
	case len(systems) == 1:
		c.system = systems[0]
		return nil
	}
	return refused(fmt.Errorf("the BMC has %s: name one in the endpoint as /systems/ID", describeIDs(ids)))
}

// systems reads the service's ComputerSystems one by one. Not gofish's Service.Systems: it reads the
// members in goroutines of its own and dereferences a member whose body is JSON null there, where no
// recover reaches: a BMC's bad answer would take the hub down (FuzzRedfishResponses found it).
func (c *redfishConn) systems() ([]*redfish.ComputerSystem, error) {
	var root struct{ Systems common.Link }
	if _, err := getJSON(c.client, "/redfish/v1/", &root); err != nil {
		return nil, err
	}
	if root.Systems == "" {
		return nil, refused(errors.New("the service root has no Systems link"))
	}
	var systems []*redfish.ComputerSystem
	for page, uri := 0, root.Systems.String(); uri != ""; page++ {
		if page == maxMemberPages {
			return nil, refused(fmt.Errorf("%s: more than %d pages of members", root.Systems, maxMemberPages))
		}
		var coll struct {
			Members []common.Link
			Next    string `json:"Members@odata.nextLink"`
		}
		if _, err := getJSON(c.client, uri, &coll); err != nil {
			return nil, err
		}
		for _, m := range coll.Members {
			sys, err := getObject[redfish.ComputerSystem](c.client, m.String())
			if err != nil {
				return nil, err
			}
			systems = append(systems, sys)
		}
		uri = coll.Next
	}
	return systems, nil
}

// maxMemberPages bounds a collection's pages: a BMC whose next link loops must not hold a step.
const maxMemberPages = 16

// getJSON reads the resource at uri into v, refusing an answer that is not a JSON object.
func getJSON(c common.Client, uri string, v any) (string, error) {
	resp, err := c.Get(uri)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxRedfishBody))
	if err != nil {
		return "", fmt.Errorf("%s: %w", uri, err)
	}
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return "", fmt.Errorf("%s: the answer is not a JSON object (%d bytes)", uri, len(body))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return "", fmt.Errorf("%s: %w", uri, err)
	}
	return resp.Header.Get("Etag"), nil
}

// maxRedfishBody bounds what is read of one answer (a system is a few KiB).
const maxRedfishBody = 4 << 20

// getObject reads a gofish entity at uri as gofish's GetObject does, through getJSON: gofish's own
// dereferences an answer of JSON null.
func getObject[T any, PT interface {
	*T
	common.SchemaObject
}](c common.Client, uri string) (*T, error) {
	entity := PT(new(T))
	etag, err := getJSON(c, uri, entity)
	if err != nil {
		return nil, err
	}
	if etag != "" {
		entity.SetETag(etag)
	}
	entity.SetClient(c)
	return entity, nil
}

func describeIDs(ids []string) string {
	switch len(ids) {
	case 0:
		return "no systems"
	case 1:
		return "one system (" + ids[0] + ")"
	}
	return fmt.Sprintf("%d systems (%s)", len(ids), strings.Join(ids, ", "))
}

func (c *redfishConn) state(context.Context) (PowerState, time.Time, error) {
	var sys *redfish.ComputerSystem
	if err := c.inSession("read system", func() (err error) {
		sys, err = getObject[redfish.ComputerSystem](c.client, c.system.ODataID)
		return err
	}); err != nil {
		return PowerUnknown, time.Time{}, err
	}
	var lastReset time.Time
	if sys.LastResetTime != "" {
		lastReset, _ = time.Parse(time.RFC3339Nano, sys.LastResetTime)
	}
	return parsePowerState(string(sys.PowerState)), lastReset, nil
}

// supports reports whether the system allows reset type a. A service that does not list its allowed
// values is assumed to support the common set, PowerCycle excepted.
func (c *redfishConn) supports(a action) bool {
	if len(c.system.SupportedResetTypes) == 0 {
		return a != actPowerCycle
	}
	return slices.Contains(c.system.SupportedResetTypes, redfish.ResetType(a))
}

func (c *redfishConn) do(_ context.Context, a action) (string, error) {
	if err := c.inSession("reset "+string(a), func() error { return c.system.Reset(redfish.ResetType(a)) }); err != nil {
		return "", err
	}
	return string(a), nil
}

func (c *redfishConn) close() { c.client.Logout() }
