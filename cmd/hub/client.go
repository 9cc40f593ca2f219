package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hale-dev/hale/hub/operator"
)

// apiClient talks to a running hub's operator API.
type apiClient struct {
	http  *http.Client
	base  string
	token string
	where string // for error messages
}

// apiFlags are the operator commands' flags to find the hub.
type apiFlags struct {
	socket, address, tokenFile string
	// cluster, in a management cluster, is the Cluster (NAMESPACE/NAME) whose cell is asked.
	cluster string
	timeout time.Duration
}

func (f *apiFlags) register(cmd *cobra.Command) {
	f.registerWhere(cmd.PersistentFlags())
	cmd.PersistentFlags().DurationVar(&f.timeout, "request-timeout", 10*time.Second, "how long one API request may take")
}

// registerWhere registers the flags that say where the hub's API is.
func (f *apiFlags) registerWhere(fs *pflag.FlagSet) {
	socket := os.Getenv("HALE_HUB_SOCKET")
	if socket == "" {
		socket = defaultSocket
	}
	fs.StringVar(&f.socket, "socket", socket, "the hub's operator API socket ($HALE_HUB_SOCKET)")
	fs.StringVar(&f.address, "api-address", "", "the hub's loopback API address instead of the socket (needs --token-file)")
	fs.StringVar(&f.tokenFile, "token-file", "", "the API token file, with --api-address")
	fs.StringVar(&f.cluster, "cluster", "", "a hub in a management cluster: the Cluster API Cluster (NAMESPACE/NAME) to ask about")
}

// status asks the hub for its status.
func (f *apiFlags) status(ctx context.Context) (operator.Status, error) {
	var st operator.Status
	c, err := f.client()
	if err == nil {
		err = c.do(ctx, http.MethodGet, "/v1/status", nil, &st)
	}
	return st, err
}

func (f *apiFlags) client() (*apiClient, error) {
	cell := ""
	if f.cluster != "" {
		ns, name, ok := strings.Cut(f.cluster, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, &codedError{exitUsage, fmt.Errorf("--cluster %q: want NAMESPACE/NAME (a Cluster API Cluster)", f.cluster)}
		}
		cell = "/clusters/" + url.PathEscape(ns) + "/" + url.PathEscape(name)
	}
	if f.address != "" {
		token, err := readToken("token-file", f.tokenFile)
		if err != nil {
			return nil, err
		}
		return &apiClient{http: &http.Client{Timeout: f.timeout}, base: "http://" + f.address + cell, token: token, where: f.address}, nil
	}
	socket := f.socket
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}
	return &apiClient{http: &http.Client{Timeout: f.timeout, Transport: tr}, base: "http://hub" + cell, where: socket}, nil
}

// do sends a request; out is a *string for text answers or a value to decode JSON into.
func (c *apiClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if _, text := out.(*string); !text {
		req.Header.Set("Accept", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return &codedError{exitUnreachable, fmt.Errorf("cannot reach the hub at %s (is `hub run` running, and may you open its socket?): %w", c.where, err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return &codedError{exitUnreachable, fmt.Errorf("reading the hub's answer: %w", err)}
	}
	if resp.StatusCode != http.StatusOK {
		var e operator.APIError
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			return c.notTheHub(fmt.Sprintf("%s (%q)", resp.Status, firstLine(string(b))))
		}
		code := exitUsage
		if resp.StatusCode == http.StatusConflict {
			code = exitRefused
		}
		return &codedError{code, errors.New(e.Error)}
	}
	if s, ok := out.(*string); ok {
		*s = string(b)
		return nil
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return c.notTheHub(fmt.Sprintf("%s to %s %s, which is no answer of Hale's (%v)", resp.Status, method, path, err))
		}
	}
	return nil
}

// notTheHub is the error for an answer that is not the operator API's: another server listens where
// the command was pointed (the hub's metrics port, say).
func (c *apiClient) notTheHub(answer string) error {
	return &codedError{exitUnreachable, fmt.Errorf("%s answered %s: that is not the hub's operator API. Point the command at the hub's "+
		"--socket, or at the address `hub run --api-address` serves (not its --metrics-address)", c.where, answer)}
}

// firstLine is s's first line, at most 200 characters.
func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	if len(line) > 200 {
		line = line[:200] + "…"
	}
	return line
}
