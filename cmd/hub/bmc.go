package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/internal/cli"
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
	inventory       string
	force           bool
	api             apiFlags
	output          *string
	timeout         time.Duration
	requestTimeout  time.Duration
	gracefulTimeout time.Duration
	caFile          string
	insecure        bool
	verbose         bool
}

func newPowerCommand() *cobra.Command {
	var f powerFlags
	cmd := &cobra.Command{
		Use:   "power status|on|off|force-off|cycle|reboot ENDPOINT|MACHINE",
		Short: "Read or change a machine's power through its BMC, verified by polling",
		Long: `power reads or changes a machine's power through its BMC and waits until the BMC reports the
expected state.

  status   print the power state
  on       power on
  off      graceful shutdown, forced off after --graceful-timeout
  force-off  power off at once, without asking the OS (what a fence does)
  cycle    hard power cycle (PowerCycle, else ForceRestart, else ForceOff + On)
  reboot   graceful restart, hard cycle when it is not supported or not proven in time

ENDPOINT is redfish://host[:port][/systems/ID] (also redfish+https://…), redfish+http://… (plain HTTP,
only when asked), a BareMetalHost's address in one of metal3's Redfish schemes (idrac-redfish://…,
redfish-virtualmedia://…, idrac-virtualmedia://…, ilo5-redfish://…, each also +http or +https) or
ipmi://host[:port]. Credentials come from --credentials (a file of username=… and password=… lines, or
a directory with username and password files, such as a mounted Kubernetes Secret) or from
HALE_BMC_USERNAME and HALE_BMC_PASSWORD; never from a flag value, which would show in ps.

MACHINE is a machine of --inventory (the hub's): its endpoint, credentials and CA bundle come from
there. A machine the running hub manages is not taken down by hand (off, force-off, cycle, reboot)
unless it is detached (hub detach MACHINE): the hub would find it Unhealthy and power it back on
within seconds. --force does it anyway.

This is the raw tool: it does not check etcd quorum (hub reboot does).

Exit codes: 0 done, 1 bad input (nothing sent), 2 the BMC refused or failed the request,
3 the BMC accepted it but the change could not be verified in time.`,
		Example: `  hub bmc power status cp-1 --inventory /etc/hale/inventory.yaml    # a machine of the inventory
  hub bmc power status redfish+https://10.0.0.101/redfish/v1/Systems/1 --credentials /etc/hale/bmc --ca-file bmc-ca.pem
  hub bmc power cycle ipmi://10.0.0.103 --credentials /etc/hale/bmc --timeout 2m
  hub bmc power force-off cp-3 --inventory /etc/hale/inventory.yaml   # detach cp-3 first (hub detach)`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error { return runPower(cmd, f, args[0], args[1]) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.credentials, "credentials", "", "credentials file or directory (else HALE_BMC_USERNAME / HALE_BMC_PASSWORD)")
	f.output = cli.OutputFlag(cmd)
	fl.StringVar(&f.inventory, "inventory", "", "the hub's inventory, to name a MACHINE instead of an ENDPOINT")
	fl.BoolVar(&f.force, "force", false, "take down a MACHINE the running hub manages though it is not detached")
	f.api.register(cmd)
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "give up after this long, verification included")
	fl.DurationVar(&f.requestTimeout, "bmc-request-timeout", 10*time.Second, "how long one request to the BMC (Redfish, or one ipmitool call) may take; "+
		"a status read tries twice, a change retries a transient failure four times")
	fl.DurationVar(&f.gracefulTimeout, "graceful-timeout", 2*time.Minute, "how long a graceful shutdown or restart may take before it is forced")
	fl.StringVar(&f.caFile, "ca-file", "", "PEM bundle to verify the Redfish BMC's certificate with")
	fl.BoolVar(&f.insecure, "insecure", false, "do not verify the Redfish BMC's certificate")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "log each request and retry to stderr")
	return cmd
}

func runPower(cmd *cobra.Command, f powerFlags, op, target string) error {
	usage := func(err error) error { return &codedError{exitUsage, err} }
	calls := map[string]func(*bmc.Controller, context.Context) (bmc.Result, error){
		"on": (*bmc.Controller).PowerOn, "off": (*bmc.Controller).PowerOff, "force-off": (*bmc.Controller).ForceOff,
		"cycle": (*bmc.Controller).PowerCycle, "reboot": (*bmc.Controller).Reboot,
	}
	if _, ok := calls[op]; !ok && op != "status" {
		return usage(fmt.Errorf("power %q: want status, on, off, force-off, cycle or reboot", op))
	}
	if err := cli.CheckOutput(*f.output); err != nil {
		return usage(err)
	}
	if f.timeout <= 0 || f.requestTimeout <= 0 {
		return usage(fmt.Errorf("--timeout %v, --bmc-request-timeout %v: both must be positive", f.timeout, f.requestTimeout))
	}
	ep, creds, err := powerTarget(cmd, &f, op, target)
	if err != nil {
		return err
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelDebug
	}
	opts := bmc.Options{VerifyTimeout: f.timeout, GracefulTimeout: f.gracefulTimeout, RequestTimeout: f.requestTimeout,
		CAFile: f.caFile, Insecure: f.insecure, Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))}
	if op == "status" {
		opts.Retries = 1 // a read that fails twice says enough (as `hub check`): a silent BMC costs two request timeouts
	}
	ctrl, err := bmc.New(ep, creds, opts)
	if err != nil {
		return usage(err)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	out := cmd.OutOrStdout()

	if op == "status" {
		st, err := ctrl.PowerState(ctx)
		if ok, werr := writeResult(out, *f.output, map[string]any{"endpoint": ep.String(), "powerState": st}, err); ok {
			return cmp.Or(werr, err)
		}
		if err == nil {
			fmt.Fprintf(out, "%s: %s\n", ep, st)
		}
		return err
	}
	res, err := calls[op](ctrl, ctx)
	if ok, werr := writeResult(out, *f.output, res, err); ok {
		return cmp.Or(werr, err)
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

// writeResult writes {result, error} as JSON or YAML; it reports false for the table formats.
func writeResult(w io.Writer, output string, v any, err error) (bool, error) {
	doc := map[string]any{"result": v}
	if err != nil {
		doc["error"] = err.Error()
	}
	return cli.WriteData(w, output, doc)
}

// powerTarget is the BMC `hub bmc power` talks to, and its credentials: an endpoint and the
// credentials flags, or an inventory machine's. A machine the running hub manages is not taken down
// by hand unless it is detached, or --force.
func powerTarget(cmd *cobra.Command, f *powerFlags, op, target string) (bmc.Endpoint, bmc.Credentials, error) {
	if strings.Contains(target, "://") || f.inventory == "" {
		ep, err := bmc.ParseEndpoint(target)
		if err != nil {
			if !strings.Contains(target, "://") {
				err = fmt.Errorf("%w (or, to name a machine, give the hub's --inventory)", err)
			}
			return ep, bmc.Credentials{}, usageErr(err)
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
		return ep, creds, usageErr(err)
	}
	if f.credentials != "" || f.caFile != "" || f.insecure {
		return bmc.Endpoint{}, bmc.Credentials{}, usageErr(fmt.Errorf("%s: its credentials and CA bundle come from --inventory: drop --credentials, --ca-file and --insecure", target))
	}
	inv, err := inventory.Load(f.inventory)
	if err != nil {
		return bmc.Endpoint{}, bmc.Credentials{}, usageErr(err)
	}
	m, ok := inv.Machine(target)
	switch {
	case !ok:
		var names []string
		for _, m := range inv.Machines {
			names = append(names, m.Name)
		}
		return bmc.Endpoint{}, bmc.Credentials{}, usageErr(fmt.Errorf("machine %q is not in %s (it has %s)", target, f.inventory, strings.Join(names, ", ")))
	case m.Endpoint.Driver == "":
		return bmc.Endpoint{}, bmc.Credentials{}, usageErr(fmt.Errorf("machine %s has no BMC in %s", target, f.inventory))
	}
	f.caFile, f.insecure = m.CAFile, m.Insecure
	if op == "status" || op == "on" || f.force {
		return m.Endpoint, m.Credentials, nil
	}
	// Is a running hub managing it? Ask it.
	where := cmp.Or(f.api.address, f.api.socket)
	st, err := f.api.status(cmd.Context())
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: no hub answered at %s (%v): if a hub manages %s, detach it there first (hub detach %s), or the hub will power it back on\n",
			where, err, target, target)
		return m.Endpoint, m.Credentials, nil
	}
	for _, ms := range st.Machines {
		if ms.Name == target && !ms.Detached {
			return bmc.Endpoint{}, bmc.Credentials{}, &codedError{exitRefused, fmt.Errorf("%s is managed by the running hub (%s): taken down by hand it would be found Unhealthy "+
				"and power-cycled back within seconds. Detach it first (hub detach %s --reason '…'; hub attach %s when done), or --force to do it anyway", target, where, target, target)}
		}
	}
	return m.Endpoint, m.Credentials, nil
}
