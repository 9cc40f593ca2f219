package bmc

import (
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
	ep    Endpoint
	creds Credentials
	http  *http.Client
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
	}
	return &redfishDriver{ep: ep, creds: creds, http: &http.Client{Transport: transport}}, nil
}

func (d *redfishDriver) name() string { return DriverRedfish }

func (d *redfishDriver) open(ctx context.Context) (conn, error) {
	cfg := gofish.ClientConfig{
		Endpoint:   d.ep.baseURL(),
		Username:   d.creds.Username,
		Password:   d.creds.Password(),
		HTTPClient: d.http,
	}
	client, err := gofish.ConnectContext(ctx, cfg)
	if err != nil && classifyRedfish(err) == classRefused {
		// No usable session service (404, 405, 501, no Sessions link): fall back to basic auth.
		cfg.BasicAuth = true
		client, err = gofish.ConnectContext(ctx, cfg)
	}
	if err != nil {
		return nil, wrapRedfish("connect", err)
	}
	c := &redfishConn{client: client}
	if err := c.pickSystem(d.ep.SystemID); err != nil {
		client.Logout()
		return nil, err
	}
	return c, nil
}

type redfishConn struct {
	client *gofish.APIClient
	system *redfish.ComputerSystem
}

func (c *redfishConn) pickSystem(id string) error {
	systems, err := c.client.Service.Systems()
	if err != nil {
		return wrapRedfish("list systems", err)
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
		return refused(fmt.Errorf("no system %q; the BMC has %s", id, describeIDs(ids)))
	case len(systems) == 1:
		c.system = systems[0]
		return nil
	}
	return refused(fmt.Errorf("the BMC has %s: name one in the endpoint as /systems/ID", describeIDs(ids)))
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
	sys, err := redfish.GetComputerSystem(c.client, c.system.ODataID)
	if err != nil {
		return PowerUnknown, time.Time{}, wrapRedfish("read system", err)
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
	if err := c.system.Reset(redfish.ResetType(a)); err != nil {
		return "", wrapRedfish("reset "+string(a), err)
	}
	return string(a), nil
}

func (c *redfishConn) close() { c.client.Logout() }

// wrapRedfish classifies a gofish error and says which request failed.
func wrapRedfish(what string, err error) error {
	switch {
	case isTLSVerification(err):
		err = fmt.Errorf("%w; give the BMC's CA bundle (--ca-file), or skip verification explicitly (--insecure)", err)
	case isPlainHTTP(err):
		err = fmt.Errorf("%w: the BMC answers plain HTTP on this port, not HTTPS; if that is intended, say so in the endpoint (redfish+http://)", err)
	}
	err = fmt.Errorf("%s: %w", what, err)
	switch classifyRedfish(err) {
	case classAuth:
		return authFailed(err)
	case classRefused:
		return refused(err)
	}
	return transient(err)
}

func classifyRedfish(err error) errClass {
	// gofish reads a collection's members concurrently and gathers their errors into one that does
	// not unwrap: a 401 inside it is still an authentication failure (classified transient, it was
	// retried, and each retry is a failed login on a BMC that counts them towards a lockout).
	var ce *common.CollectionError
	if errors.As(err, &ce) {
		class := classRefused
		for _, e := range ce.Failures {
			switch classifyRedfish(e) {
			case classAuth:
				return classAuth
			case classTransient:
				class = classTransient
			}
		}
		return class
	}
	var ge *common.Error
	if errors.As(err, &ge) {
		switch code := ge.HTTPReturnedStatusCode; {
		case code == http.StatusUnauthorized || code == http.StatusForbidden:
			return classAuth
		case code >= 500 || code == http.StatusTooManyRequests || code == http.StatusRequestTimeout:
			return classTransient
		case code == 0:
			return classRefused // gofish's own "no target" errors: the service lacks a link
		}
		return classRefused
	}
	var syntax *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return classRefused
	case errors.As(err, &syntax), errors.As(err, &typeErr), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return classTransient // a truncated or garbled answer: worth another try
	case isPlainHTTP(err):
		return classRefused
	case isTLSVerification(err), strings.Contains(err.Error(), "is not supported by this service"),
		strings.Contains(err.Error(), "no target provided"): // gofish: the service lacks a link it needs
		return classRefused
	case errors.As(err, &netErr):
		return classTransient
	}
	return classTransient
}

// isPlainHTTP: a TLS handshake answered by a plain-HTTP server, a configuration error. net/http says
// so in an error of its own (errors.New) when the answer looks like HTTP.
func isPlainHTTP(err error) bool {
	var rh tls.RecordHeaderError
	return errors.As(err, &rh) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}

func isTLSVerification(err error) bool {
	var verr *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	return errors.As(err, &verr) || errors.As(err, &unknown) || errors.As(err, &hostname)
}
