// Package bmcval holds a BMC's values: where it is and how to speak to it (Endpoint), the account
// to log in with (Credentials, whose password no print shows), and what it answers (PowerState,
// Evidence, Problem). It imports nothing of Hale's and no I/O, so that the hub's pure packages read
// them without the drivers (package bmc, whose names for these are aliases of these).
package bmcval

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Driver names.
const (
	DriverRedfish = "redfish"
	DriverIPMI    = "ipmi"
)

// Endpoint is where a BMC is and how to speak to it. It never holds credentials.
type Endpoint struct {
	// Driver is DriverRedfish or DriverIPMI.
	Driver string
	Host   string
	Port   int
	// PlainHTTP is set by redfish+http:// (only when explicitly asked; Redfish is HTTPS by default).
	PlainHTTP bool
	// SystemID picks one ComputerSystem of a Redfish service; empty means "the only one".
	SystemID string
}

// metal3RedfishSchemes are metal3's other URL schemes of a Redfish BMC (baremetal-operator's
// bmc.address), each also with +http or +https: whatever they provision with, their power control is
// Redfish's ComputerSystem.Reset.
const metal3RedfishSchemes = "idrac-redfish, redfish-virtualmedia, idrac-virtualmedia, ilo5-redfish"

// ParseEndpoint reads redfish://host[:port][/systems/ID] (redfish+https://: the same), redfish+http://…
// (plain HTTP), metal3's Redfish schemes, or ipmi://host[:port]. The Redfish path may also be the full
// resource path, /redfish/v1/Systems/ID, as metal3 writes it.
func ParseEndpoint(s string) (Endpoint, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil || u.Host == "" {
		return Endpoint{}, fmt.Errorf("BMC endpoint %q: want redfish://host[:port][/systems/ID], redfish+http://… or ipmi://host[:port]", redactURL(s))
	}
	if u.User != nil {
		return Endpoint{}, fmt.Errorf("BMC endpoint %q: credentials in the URL are not accepted (they would show in ps and logs); "+
			"put them in a credentials file", redactURL(s))
	}
	ep := Endpoint{Host: u.Hostname()}
	defPort := 443
	base, transport, _ := strings.Cut(u.Scheme, "+")
	switch {
	case u.Scheme == "ipmi":
		ep.Driver, defPort = DriverIPMI, 623
	case base != "redfish" && !slices.Contains(strings.Split(metal3RedfishSchemes, ", "), base) || transport != "" && transport != "http" && transport != "https":
		return Endpoint{}, fmt.Errorf("BMC endpoint %q: unknown scheme %q; want redfish (redfish+https), redfish+http, ipmi, or one of metal3's "+
			"Redfish schemes (%s, each also +http or +https)", s, u.Scheme, metal3RedfishSchemes)
	case transport == "http":
		ep.Driver, ep.PlainHTTP, defPort = DriverRedfish, true, 80
	default:
		ep.Driver = DriverRedfish
	}
	ep.Port = defPort
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return Endpoint{}, fmt.Errorf("BMC endpoint %q: port %q is not a number from 1 to 65535", s, p)
		}
		ep.Port = n
	}
	path := strings.Trim(u.Path, "/")
	switch {
	case path == "":
	case ep.Driver == DriverIPMI:
		return Endpoint{}, fmt.Errorf("BMC endpoint %q: an ipmi endpoint has no path", s)
	default:
		id, ok := strings.CutPrefix(path, "systems/")
		if !ok {
			id, ok = strings.CutPrefix(path, "redfish/v1/Systems/")
		}
		if !ok || id == "" || strings.Contains(id, "/") {
			return Endpoint{}, fmt.Errorf("BMC endpoint %q: path %q: want /systems/ID or /redfish/v1/Systems/ID", s, u.Path)
		}
		ep.SystemID = id
	}
	return ep, nil
}

func (e Endpoint) String() string {
	scheme := e.Driver
	if e.PlainHTTP {
		scheme = "redfish+http"
	}
	s := scheme + "://" + net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
	if e.SystemID != "" {
		s += "/systems/" + e.SystemID
	}
	return s
}

// BaseURL is the HTTP(S) root of a Redfish service.
func (e Endpoint) BaseURL() string {
	scheme := "https"
	if e.PlainHTTP {
		scheme = "http"
	}
	return scheme + "://" + net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
}

// redactURL drops any user information from a URL-like string before it is shown.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		u.User = nil
		return u.String()
	}
	if i := strings.Index(s, "@"); i >= 0 {
		if j := strings.Index(s, "://"); j >= 0 && j < i {
			return s[:j+3] + "…" + s[i:]
		}
		return "…" + s[i:]
	}
	return s
}
