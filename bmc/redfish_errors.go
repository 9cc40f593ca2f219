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
	"strings"
	"time"

	"github.com/stmcginnis/gofish/common"
)

// wrapRedfish classifies a gofish error and says which request failed, in a line: a BMC's error body
// is reduced to its status, message ID and message, and one that never answered is ErrUnreachable.
func wrapRedfish(ctx context.Context, what string, err error, timeout time.Duration) error {
	if ctx.Err() != nil && unreachable(err, timeout) != "" {
		return deadlineRanOut(ctx, what)
	}
	if why := unreachable(err, timeout); why != "" {
		return transient(&marked{[]error{ErrUnreachable}, what + ": " + why})
	}
	err = answerOf(err)
	switch {
	case isTLSVerification(err):
		err = fmt.Errorf("%w; give the BMC's CA bundle (the inventory's caFile for the machine; `hub bmc power` takes --ca-file), or skip verification explicitly (insecure: true; --insecure)", err)
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

// unauthorized says whether err is a BMC's 401 answer.
func unauthorized(err error) bool {
	var ge *common.Error
	return errors.As(err, &ge) && ge.HTTPReturnedStatusCode == http.StatusUnauthorized
}

// answerOf is err with a BMC's error answer in one line (answer), as wrapRedfish writes it.
func answerOf(err error) error {
	if ge := (*common.Error)(nil); errors.As(err, &ge) {
		return answer{ge}
	}
	return err
}

func classifyRedfish(err error) errClass {
	if c := (*classified)(nil); errors.As(err, &c) {
		return c.class // our own refusals (no Systems link, too many pages) keep their class
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

// unreachable says how a request got no answer ("" when it got one): no connection, or none within
// the request timeout.
func unreachable(err error, timeout time.Duration) string {
	var op *net.OpError
	var dns *net.DNSError
	var ne net.Error
	switch {
	case errors.As(err, &dns):
		return "cannot resolve " + dns.Name + ": " + dns.Err
	case errors.As(err, &op) && op.Op == "dial":
		var sys *os.SyscallError
		if errors.As(op.Err, &sys) {
			return "cannot connect: " + sys.Err.Error() // "connection refused", not "connect: connection refused"
		}
		return "cannot connect: " + op.Err.Error()
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("no answer within %v", timeout)
	}
	return "" // an answer, even one cut short
}

// answer is a Redfish error answer in one line: "HTTP 401 Unauthorized: Base.1.0.NoValidSession:
// <message>" rather than the whole body gofish keeps (hundreds of characters, newlines).
type answer struct{ e *common.Error }

func (a answer) Unwrap() error { return a.e }

func (a answer) Error() string {
	code := a.e.HTTPReturnedStatusCode
	out := fmt.Sprintf("HTTP %d %s", code, http.StatusText(code))
	id, msg := a.e.Code, a.e.Message
	if len(a.e.ExtendedInfos) > 0 {
		id, msg = a.e.ExtendedInfos[0].MessageID, a.e.ExtendedInfos[0].Message
	}
	if id != "" {
		out += ": " + id
	}
	if msg = strings.Join(strings.Fields(msg), " "); msg != "" {
		if len(msg) > 160 {
			msg = msg[:160] + "…"
		}
		out += ": " + msg
	}
	return out
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
