package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcsim"
)

type simulateFlags struct {
	listen, credentials, stateDir string
	systems                       []string
	resetTypes                    []string
	plainHTTP                     bool
	powerOnDelay, shutdownDelay   time.Duration
	cycleOff                      time.Duration
}

func newSimulateCommand() *cobra.Command {
	var f simulateFlags
	cmd := &cobra.Command{
		Use:   "bmc-simulator",
		Short: "Run a simulated Redfish BMC (for trying Hale and its tools by hand)",
		Long: `bmc-simulator runs Hale's stateful Redfish BMC simulator until interrupted: a service root, sessions,
one or more systems whose power moves through timed transitions on ComputerSystem.Reset, managers and
chassis, over HTTPS with a generated certificate (or plain HTTP with --http).

It writes a credentials file and the certificate (its own CA) to --state-dir and prints the command
that talks to it.`,
		Example: `  hale-demo bmc-simulator                                   # HTTPS on 127.0.0.1:8443; prints the hub bmc power command
  hale-demo bmc-simulator --http --system cp-0,cp-1,cp-2   # three systems over plain HTTP
  hale-demo bmc-simulator --power-on-delay 30s             # a slow server, for --bmc-verify-timeout`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSimulate(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8443", "address to listen on")
	fl.StringSliceVar(&f.systems, "system", []string{"1"}, "system IDs to simulate (repeat or comma-separate)")
	fl.StringSliceVar(&f.resetTypes, "reset-types", bmcsim.DefaultResetTypes(), "ResetType@Redfish.AllowableValues to advertise")
	fl.BoolVar(&f.plainHTTP, "http", false, "serve plain HTTP instead of HTTPS")
	fl.StringVar(&f.credentials, "credentials", "", "credentials file to accept (default: generate one in --state-dir)")
	fl.StringVar(&f.stateDir, "state-dir", "", "where to write the credentials and certificate (default: a new temporary directory)")
	fl.DurationVar(&f.powerOnDelay, "power-on-delay", 2*time.Second, "time a system spends PoweringOn")
	fl.DurationVar(&f.shutdownDelay, "shutdown-delay", 3*time.Second, "time a graceful shutdown takes")
	fl.DurationVar(&f.cycleOff, "cycle-off", time.Second, "time a system stays off during a power cycle")
	return cmd
}

func runSimulate(cmd *cobra.Command, f simulateFlags) error {
	if len(f.systems) == 0 {
		return errors.New("--system: name at least one system ID")
	}
	dir := f.stateDir
	var err error
	if dir == "" {
		if dir, err = os.MkdirTemp("", "hale-bmcsim-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	credFile := f.credentials
	var creds bmc.Credentials
	if credFile == "" {
		buf := make([]byte, 12)
		_, _ = rand.Read(buf)
		creds = bmc.NewCredentials("admin", hex.EncodeToString(buf))
		credFile = filepath.Join(dir, "credentials")
		body := "username=" + creds.Username + "\npassword=" + creds.Password() + "\n"
		if err := os.WriteFile(credFile, []byte(body), 0o600); err != nil {
			return err
		}
	} else if creds, err = bmc.LoadCredentials(credFile); err != nil {
		return err
	}
	cfg := bmcsim.Config{Addr: f.listen, Username: creds.Username, Password: creds.Password(), PlainHTTP: f.plainHTTP}
	for _, id := range f.systems {
		cfg.Systems = append(cfg.Systems, bmcsim.SystemConfig{ID: id, ResetTypes: f.resetTypes,
			PowerOnDelay: f.powerOnDelay, ShutdownDelay: f.shutdownDelay, CycleOffDuration: f.cycleOff})
	}
	sim, err := bmcsim.Start(cfg)
	if err != nil {
		return err
	}
	defer sim.Close()
	out := cmd.OutOrStdout()
	tlsFlag := ""
	if pem := sim.CertPEM(); pem != nil {
		caFile := filepath.Join(dir, "ca.pem")
		if err := os.WriteFile(caFile, pem, 0o600); err != nil {
			return err
		}
		tlsFlag = " --ca-file " + caFile
	}
	fmt.Fprintf(out, "bmcsim: serving %s (systems: %s)\n", sim.Endpoint(), strings.Join(f.systems, ", "))
	fmt.Fprintf(out, "  credentials: %s\n", credFile)
	fmt.Fprintf(out, "  try:         hub bmc power status %s/systems/%s --credentials %s%s\n", sim.Endpoint(), f.systems[0], credFile, tlsFlag)
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	fmt.Fprintln(out, "bmcsim: stopped")
	return nil
}
