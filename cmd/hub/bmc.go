package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/bmc"
)

// Exit codes of `hub bmc power`.
const (
	exitOK         = 0
	exitUsage      = 1 // bad flags, endpoint or credentials: nothing was sent
	exitBMCFailed  = 2 // the BMC refused or failed the request (authentication included)
	exitUnverified = 3 // the BMC accepted it, but the expected state was not observed in time
)

// codedError carries an exit code.
type codedError struct {
	code int
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

// usageErr marks err (when not nil) as bad input: exit 1.
func usageErr(err error) error {
	if err == nil {
		return nil
	}
	return &codedError{exitUsage, err}
}

func exitCode(err error) int {
	var ce *codedError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ce):
		return ce.code
	case errors.Is(err, bmc.ErrUnverified):
		return exitUnverified
	case errors.Is(err, bmc.ErrRefused), errors.Is(err, bmc.ErrAuth):
		return exitBMCFailed
	}
	return exitUsage
}

func newBMCCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "bmc", Short: "Talk to BMCs directly (no quorum check: see `hub reboot` for that)"}
	cmd.AddCommand(newPowerCommand())
	return cmd
}

type powerFlags struct {
	credentials     string
	output          string
	timeout         time.Duration
	gracefulTimeout time.Duration
	caFile          string
	insecure        bool
	verbose         bool
}

func newPowerCommand() *cobra.Command {
	var f powerFlags
	cmd := &cobra.Command{
		Use:   "power status|on|off|force-off|cycle|reboot ENDPOINT",
		Short: "Read or change a machine's power through its BMC, verified by polling",
		Long: `power reads or changes a machine's power through its BMC and waits until the BMC reports the
expected state.

  status   print the power state
  on       power on
  off      graceful shutdown, forced off after --graceful-timeout
  force-off  power off at once, without asking the OS (what a fence does)
  cycle    hard power cycle (PowerCycle, else ForceRestart, else ForceOff + On)
  reboot   graceful restart, hard cycle when it is not supported or not proven in time

ENDPOINT is redfish://host[:port][/systems/ID], redfish+http://… (plain HTTP, only when asked) or
ipmi://host[:port]. Credentials come from --credentials (a file of username=… and password=… lines, or
a directory with username and password files, such as a mounted Kubernetes Secret) or from
HALE_BMC_USERNAME and HALE_BMC_PASSWORD; never from a flag value, which would show in ps.

This is the raw tool: it does not check etcd quorum.

Exit codes: 0 done, 1 bad input (nothing sent), 2 the BMC refused or failed the request,
3 the BMC accepted it but the change could not be verified in time.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error { return runPower(cmd, f, args[0], args[1]) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.credentials, "credentials", "", "credentials file or directory (else HALE_BMC_USERNAME / HALE_BMC_PASSWORD)")
	fl.StringVarP(&f.output, "output", "o", "text", "output: text or json")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "give up after this long, verification included")
	fl.DurationVar(&f.gracefulTimeout, "graceful-timeout", 2*time.Minute, "how long a graceful shutdown or restart may take before it is forced")
	fl.StringVar(&f.caFile, "ca-file", "", "PEM bundle to verify the Redfish BMC's certificate with")
	fl.BoolVar(&f.insecure, "insecure", false, "do not verify the Redfish BMC's certificate")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "log each request and retry to stderr")
	return cmd
}

func runPower(cmd *cobra.Command, f powerFlags, op, endpoint string) error {
	usage := func(err error) error { return &codedError{exitUsage, err} }
	calls := map[string]func(*bmc.Controller, context.Context) (bmc.Result, error){
		"on": (*bmc.Controller).PowerOn, "off": (*bmc.Controller).PowerOff, "force-off": (*bmc.Controller).ForceOff,
		"cycle": (*bmc.Controller).PowerCycle, "reboot": (*bmc.Controller).Reboot,
	}
	if _, ok := calls[op]; !ok && op != "status" {
		return usage(fmt.Errorf("power %q: want status, on, off, force-off, cycle or reboot", op))
	}
	if f.output != "text" && f.output != "json" {
		return usage(fmt.Errorf("-o %q: want text or json", f.output))
	}
	if f.timeout <= 0 {
		return usage(fmt.Errorf("--timeout %v: must be positive", f.timeout))
	}
	ep, err := bmc.ParseEndpoint(endpoint)
	if err != nil {
		return usage(err)
	}
	var creds bmc.Credentials
	switch {
	case f.credentials != "":
		creds, err = bmc.LoadCredentials(f.credentials)
	case os.Getenv(bmc.EnvUsername) != "" || os.Getenv(bmc.EnvPassword) != "":
		creds, err = bmc.CredentialsFromEnv()
	default:
		err = fmt.Errorf("no BMC credentials: give --credentials FILE, or set %s and %s", bmc.EnvUsername, bmc.EnvPassword)
	}
	if err != nil {
		return usage(err)
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelDebug
	}
	ctrl, err := bmc.New(ep, creds, bmc.Options{
		VerifyTimeout: f.timeout, GracefulTimeout: f.gracefulTimeout, CAFile: f.caFile, Insecure: f.insecure,
		Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level})),
	})
	if err != nil {
		return usage(err)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	out := cmd.OutOrStdout()

	if op == "status" {
		st, err := ctrl.PowerState(ctx)
		if f.output == "json" {
			return writeJSONResult(out, map[string]any{"endpoint": ep.String(), "powerState": st}, err)
		}
		if err == nil {
			fmt.Fprintf(out, "%s: %s\n", ep, st)
		}
		return err
	}
	res, err := calls[op](ctrl, ctx)
	if f.output == "json" {
		return writeJSONResult(out, res, err)
	}
	if err == nil || len(res.Requests) > 0 {
		writeResultText(out, res, err)
	}
	return err
}

func writeResultText(w io.Writer, r bmc.Result, err error) {
	verdict := "done"
	switch {
	case errors.Is(err, bmc.ErrUnverified):
		verdict = "NOT VERIFIED"
	case err != nil:
		verdict = "FAILED"
	case r.Already:
		verdict = "nothing to do"
	}
	fmt.Fprintf(w, "%s: power %s %s in %v\n", r.Endpoint, r.Operation, verdict, r.Duration.Round(time.Millisecond))
	fmt.Fprintf(w, "  before:   %s\n  after:    %s\n", r.Before, r.After)
	if len(r.Requests) > 0 {
		fmt.Fprintf(w, "  sent:     %s\n", strings.Join(r.Requests, ", "))
	}
	if r.Evidence != "" {
		fmt.Fprintf(w, "  verified: %s\n", r.Evidence)
	}
}

func writeJSONResult(w io.Writer, v any, err error) error {
	doc := map[string]any{"result": v}
	if err != nil {
		doc["error"] = err.Error()
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if werr := enc.Encode(doc); werr != nil {
		return werr
	}
	return err
}
