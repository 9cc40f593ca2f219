package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/hale-dev/hale/test/demo"
	"github.com/hale-dev/hale/test/lab/inproc"
)

type demoOptions struct {
	scenarios []string
	keep      bool
	dir       string
	logLevel  string
}

func newDemoCommand() *cobra.Command {
	var o demoOptions
	var names []string
	for _, s := range demo.Scenarios() {
		names = append(names, s.Name)
	}
	cmd := &cobra.Command{
		Use:   "hale-demo",
		Short: "Run Hale on a simulated 3-machine control plane and watch it heal (no setup needed)",
		Long: `Run Hale end to end on this machine: a 3-member etcd cluster (embedded), three simulated machines
each with a real agent and a simulated Redfish BMC whose power starts and stops that machine's etcd
member and agent, two witness agents (hosts that observe and vote), and the hub. The scenarios run in
order and print a timeline:

  hang                    one machine hangs → detected → power-cycled → rejoins
  quorum-lost             two of three hang (quorum lost); the hub, cp-0 and the witnesses are 4 of 6
                          observers → dead members power-cycled → quorum restored
  quorum-lost-no-witness  the same with no witness listed: 2 of 4 observers, no majority → held and
                          explained; an operator's hub reboot --force brings them back
  partition               the hub and cp-0 cut off from cp-1, cp-2 and the witnesses → the hub hears 2 of
                          6 and does nothing; healed → all healthy, no BMC call
  refused-reboot          a manual reboot of a healthy member while another is down → refused with the reason
  pause                   a pause while a remediation is in flight → Pausing, then Paused once its BMC step is done
  permanent-loss          cp-1 and cp-2 die for good (power supply and disk) → quorum lost FOR GOOD on the BMCs'
                          word → hub recover: the plan; --yes: fenced → agent recover on cp-0: a one-member
                          cluster with every key, revisions bumped → the replacements powered on one at a time
                          (a second refused while the first could run the old cluster) and rejoined

It exits 0 only if every scenario ended as expected. --keep leaves everything running afterwards and
serves the operator API, so that hub status, explain, reboot, pause … can be tried in another terminal.`,
		Example: `  hale-demo                                     # every scenario, about a minute and a half
  hale-demo --scenario permanent-loss           # one scenario
  hale-demo --scenario hang --keep              # then, in another terminal: hub status (the socket it prints)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runDemo(ctx, o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringSliceVar(&o.scenarios, "scenario", nil, "run only these scenarios (comma-separated): "+strings.Join(names, ", "))
	cmd.Flags().BoolVar(&o.keep, "keep", false, "keep running after the scenarios, serving the operator API (Ctrl-C stops)")
	cmd.Flags().StringVar(&o.dir, "dir", "", "where to keep etcd data, the journal and the API socket (default: a new temporary directory, removed at the end)")
	cmd.Flags().StringVar(&o.logLevel, "log-level", "", "also print the hub's structured logs at this level to stderr (debug, info, warn, error)")
	return cmd
}

func runDemo(ctx context.Context, o demoOptions, stdout, stderr io.Writer) error {
	scenarios, err := demo.Select(o.scenarios)
	if err != nil {
		return fmt.Errorf("--scenario: %w", err)
	}
	log := slog.New(slog.DiscardHandler)
	if o.logLevel != "" {
		var level slog.Level
		if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
			return fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)
		}
		log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	}
	dir := o.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "hale-demo-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	started := time.Now()
	tb, err := inproc.Start(inproc.AtDemoPace(inproc.Options{Dir: dir, Timeline: stdout, Log: log}))
	if err != nil {
		return err
	}
	defer tb.Close()
	if err := tb.StartHub(inproc.HubOptions{}); err != nil {
		return err
	}
	runErr := demo.Run(ctx, demo.InProcess(tb), scenarios)
	failed := 0
	if runErr != nil {
		failed = strings.Count(runErr.Error(), "scenario ")
	}
	fmt.Fprintf(stdout, "\nsummary: %d of %d scenarios passed in %v\n", len(scenarios)-min(failed, len(scenarios)), len(scenarios),
		time.Since(started).Round(100*time.Millisecond))
	if o.keep && ctx.Err() == nil {
		if err := keepServing(ctx, tb, dir, stdout); err != nil {
			return err
		}
	}
	if runErr != nil {
		return fmt.Errorf("the demo did not end as expected:\n%w", runErr)
	}
	return nil
}

// keepServing serves the operator API on a socket in dir (mode 0600) until ctx ends.
func keepServing(ctx context.Context, tb *inproc.Cluster, dir string, stdout io.Writer) error {
	socket := filepath.Join(dir, "hub.sock")
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", socket)
	syscall.Umask(old)
	if err != nil {
		return fmt.Errorf("the operator API's socket: %w", err)
	}
	defer os.Remove(socket)
	srv := &http.Server{Handler: tb.Hub().APIHandler(""), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	fmt.Fprintf(stdout, `
The demo keeps running (Ctrl-C stops it). In another terminal:
  export HALE_HUB_SOCKET=%s
  hub status
  hub explain cp-1
  hub reboot cp-1 --dry-run
  hub pause --wait; hub resume
  hub bmc power off --credentials %s %s/systems/cp-2    # cut a machine's power: the hub heals it
(hub is go run ./cmd/hub, or the built binary)
`, socket, tb.CredentialsFile(), tb.Sim().Endpoint())
	<-ctx.Done()
	return nil
}
