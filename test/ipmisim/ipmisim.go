// Package ipmisim starts Debian's ipmi_sim (OpenIPMI's LAN BMC simulator) on 127.0.0.1 for tests and
// benchmarks: a generated lan.conf with one admin user, an emulator command file that makes MC 0x20
// the BMC with a System Event Log (its clock set to the host's, as a BMC whose host or NTP set it), and
// a chassis_control program that keeps the power state in a file and logs every call, so a test can
// count the power actions a BMC received.
package ipmisim

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Sim is a running ipmi_sim.
type Sim struct {
	// Host and Port to give ipmitool; Username and Password of its admin user.
	Host               string
	Port               int
	Username, Password string
	dir                string
	wrap               []string
	cmd                *exec.Cmd
}

// Options place a simulator elsewhere than on a free port of 127.0.0.1.
type Options struct {
	// Host and Port to listen on (default 127.0.0.1 and a free port).
	Host string
	Port int
	// Wrap prefixes ipmi_sim's command line and the readiness check's ipmitool (for example
	// ip netns exec NS, to run it inside a network namespace).
	Wrap []string
	// Password of the admin user (default ipmi-PID).
	Password string
}

// chassisControl is called by ipmi_sim as PROG <mc> get <parm>... or PROG <mc> set <parm> <value>....
// It keeps the power in $DIR/power and logs each call to $DIR/calls. "shutdown 1" (chassis power soft)
// is an OS shutting down: power goes to 0 after 200 ms. "reset 1" is a warm reset: logged only.
// The power file is replaced, never rewritten in place: a "get" that read it between the truncation
// and the write of an in-place rewrite saw no power, and ipmi_sim answered "Unspecified error".
const chassisControl = `#!/bin/sh
dir=$(dirname "$0")
setpower() { t=$(mktemp "$dir/power.XXXXXX") && echo "$1" > "$t" && mv -f "$t" "$dir/power"; }
echo "$(date +%s.%N) $*" >> "$dir/calls"
shift
op=$1; shift
case $op in
get)
	for p in "$@"; do
		[ "$p" = power ] && echo "power:$(cat "$dir/power")"
	done ;;
set)
	while [ $# -ge 2 ]; do
		case $1 in
		power) setpower "$2" ;;
		shutdown) [ "$2" = 1 ] && (sleep 0.2; setpower 0) >/dev/null 2>&1 & ;;
		esac
		shift 2
	done ;;
esac
exit 0
`

// Start starts ipmi_sim with the machine powered on, and stops it when the test ends. It fails the
// test, naming the package to install, when ipmi_sim or ipmitool is missing.
func Start(tb testing.TB) *Sim {
	tb.Helper()
	s, err := StartIn(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// StartIn starts ipmi_sim with its files in dir (which must exist), the machine powered on; Stop
// stops it.
func StartIn(dir string) (*Sim, error) { return StartAt(dir, Options{}) }

// StartAt is StartIn with options.
func StartAt(dir string, o Options) (*Sim, error) {
	for _, bin := range []struct{ name, pkg string }{{"ipmi_sim", "openipmi"}, {"ipmitool", "ipmitool"}} {
		if _, err := exec.LookPath(bin.name); err != nil {
			return nil, fmt.Errorf("%s is not on PATH: install Debian's %s (test/run installs it)", bin.name, bin.pkg)
		}
	}
	host, port := o.Host, o.Port
	if host == "" {
		host = "127.0.0.1"
	}
	if port == 0 {
		var err error
		if port, err = freeUDPPort(); err != nil {
			return nil, err
		}
	}
	s := &Sim{Host: host, Port: port, Username: "admin", Password: cmp.Or(o.Password, "ipmi-"+strconv.Itoa(os.Getpid())), dir: dir, wrap: o.Wrap}
	lan := fmt.Sprintf(`name "hale"
set_working_mc 0x20
  startlan 1
    addr %s %d
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "%s 0x20"
  user 2 true "%s" "%s" admin 10 none md2 md5 straight
`, host, port, filepath.Join(dir, "chassis_control"), s.Username, s.Password)
	emu := "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nsel_enable 0x20 1000 0x0a\nmc_enable 0x20\n"
	for name, body := range map[string]string{"lan.conf": lan, "cmd.emu": emu, "chassis_control": chassisControl, "power": "1\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o700); err != nil {
			return nil, fmt.Errorf("ipmisim: %w", err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "state"), 0o700); err != nil {
		return nil, fmt.Errorf("ipmisim: %w", err)
	}
	argv := append(slices.Clone(o.Wrap), "ipmi_sim", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "cmd.emu"),
		"-s", filepath.Join(dir, "state"), "-n")
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Dir = dir
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("ipmisim: starting ipmi_sim: %w", err)
	}
	// Ready when it answers a power status.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := s.Ipmitool(context.Background(), "chassis", "power", "status")
		if err == nil && strings.Contains(out, "Chassis Power is") {
			// ipmi_sim's SEL clock starts as seconds since its start ("S+"); a BMC's is set.
			if out, err := s.Ipmitool(context.Background(), "sel", "time", "set", "now"); err != nil {
				s.Stop()
				return nil, fmt.Errorf("ipmisim: setting the SEL's clock: %v: %s", err, out)
			}
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("ipmisim: ipmi_sim on %s:%d did not answer in 10 s: %v %s", host, port, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops ipmi_sim.
func (s *Sim) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Signal sends sig to ipmi_sim (SIGSTOP: a BMC that stops answering).
func (s *Sim) Signal(sig syscall.Signal) {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Endpoint is the ipmi:// endpoint of the simulator.
func (s *Sim) Endpoint() string { return fmt.Sprintf("ipmi://%s:%d", s.Host, s.Port) }

// Ipmitool runs plain ipmitool -I lanplus -C 3 against the simulator, password through the environment.
func (s *Sim) Ipmitool(ctx context.Context, args ...string) (string, error) {
	base := []string{"-I", "lanplus", "-C", "3", "-H", s.Host, "-p", strconv.Itoa(s.Port), "-U", s.Username, "-E", "-N", "1", "-R", "2"}
	argv := append(append(append(slices.Clone(s.wrap), "ipmitool"), base...), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "IPMITOOL_PASSWORD="+s.Password)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// SEL records, as ipmitool's `sel add` takes them: seven bytes (the event message revision, the sensor
// type, the sensor number, the event type, three bytes of event data), as a host's OS or firmware logs
// them through the BMC.
const (
	SELOSCriticalStop = "0x04 0x20 0x01 0x6f 0x01 0xff 0xff" // OS Critical Stop: run-time critical stop (a kernel panic)
	SELOSShutdown     = "0x04 0x20 0x01 0x6f 0x03 0xff 0xff" // OS Critical Stop: OS graceful shutdown
	SELMachineCheck   = "0x04 0x07 0x02 0x6f 0x0b 0xff 0xff" // Processor: uncorrectable machine check exception
	SELWatchdogExpiry = "0x04 0x23 0x03 0x6f 0x00 0xff 0xff" // Watchdog 2: timer expired
	SELWatchdogReset  = "0x04 0x23 0x03 0x6f 0x01 0xff 0xff" // Watchdog 2: hard reset (the BMC restarted the host)
	SELTemperature    = "0x04 0x01 0x30 0x01 0x09 0xff 0xff" // Temperature: upper critical going high
)

// AddSEL logs records (SEL* above) in the BMC's System Event Log, dated by its clock, as ipmitool's
// `sel add` does.
func (s *Sim) AddSEL(ctx context.Context, records ...string) error {
	f, err := os.CreateTemp(s.dir, "sel-*.txt")
	if err != nil {
		return fmt.Errorf("ipmisim: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(strings.Join(records, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("ipmisim: %w", err)
	}
	if out, err := s.Ipmitool(ctx, "sel", "add", f.Name()); err != nil {
		return fmt.Errorf("ipmisim: sel add: %v: %s", err, out)
	}
	return nil
}

// Power is the simulated machine's power: true when on.
func (s *Sim) Power() bool {
	b, _ := os.ReadFile(filepath.Join(s.dir, "power"))
	return strings.TrimSpace(string(b)) == "1"
}

// SetPower changes the machine's power from outside (a crash, a pulled plug).
func (s *Sim) SetPower(on bool) {
	v := "0\n"
	if on {
		v = "1\n"
	}
	tmp := filepath.Join(s.dir, "power.set")
	if os.WriteFile(tmp, []byte(v), 0o600) == nil {
		_ = os.Rename(tmp, filepath.Join(s.dir, "power"))
	}
}

// Actions returns every state-changing call the BMC made to the machine ("power 0", "power 1",
// "shutdown 1", "reset 1"), in order.
func (s *Sim) Actions() []string {
	var out []string
	for _, a := range s.TimedActions() {
		out = append(out, a.What)
	}
	return out
}

// Action is one state-changing call and when the BMC made it.
type Action struct {
	At   time.Time
	What string
}

// TimedActions is Actions with the time of each.
func (s *Sim) TimedActions() []Action {
	f, err := os.Open(filepath.Join(s.dir, "calls"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []Action
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text()) // <unix time> <mc> set <parm> <value>
		if len(fields) < 5 || fields[2] != "set" {
			continue
		}
		secs, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		out = append(out, Action{At: time.Unix(0, int64(secs*1e9)), What: fields[3] + " " + fields[4]})
	}
	return out
}

func freeUDPPort() (int, error) {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("ipmisim: finding a free UDP port: %w", err)
	}
	defer c.Close()
	addr, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return 0, errors.New("ipmisim: not a UDP address")
	}
	return addr.Port, nil
}
