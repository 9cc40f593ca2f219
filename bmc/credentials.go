package bmc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/hale-dev/hale/internal/secretfile"
)

// Credentials are a BMC user name and password. The password is unexported and every way of printing
// Credentials (fmt verbs, slog) redacts it.
type Credentials struct {
	Username string
	password string
}

// NewCredentials returns credentials for username and password.
func NewCredentials(username, password string) Credentials {
	return Credentials{Username: username, password: password}
}

// Password returns the password, for the drivers only.
func (c Credentials) Password() string { return c.password }

func (c Credentials) String() string { return fmt.Sprintf("user %q, password redacted", c.Username) }

// GoString keeps %#v from printing the password.
func (c Credentials) GoString() string { return c.String() }

// LogValue keeps slog from printing the password.
func (c Credentials) LogValue() slog.Value {
	return slog.GroupValue(slog.String("username", c.Username), slog.String("password", "redacted"))
}

// Format keeps every other fmt verb (%v, %+v, %s, %q) from printing the password.
func (c Credentials) Format(f fmt.State, verb rune) { _, _ = f.Write([]byte(c.String())) }

// Environment variables read by CredentialsFromEnv.
const (
	EnvUsername = "HALE_BMC_USERNAME"
	EnvPassword = "HALE_BMC_PASSWORD"
)

// LoadCredentials reads credentials from path: either a directory holding files named username and
// password (a Kubernetes Secret mounted as a volume, as metal3 BMC secrets are), or a file of
// username=… and password=… lines (# starts a comment).
func LoadCredentials(path string) (Credentials, error) {
	info, err := os.Stat(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("BMC credentials: %w", err)
	}
	if info.IsDir() {
		var c Credentials
		for name, dst := range map[string]*string{"username": &c.Username, "password": &c.password} {
			b, err := secretfile.Read(filepath.Join(path, name))
			if err != nil {
				return Credentials{}, fmt.Errorf("BMC credentials directory %s: %w (want files username and password)", path, err)
			}
			*dst = strings.TrimRight(string(b), "\r\n")
		}
		return c.check(path)
	}
	b, err := secretfile.Read(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("BMC credentials: %w", err)
	}
	var c Credentials
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		switch key = strings.TrimSpace(key); {
		case !ok:
			return Credentials{}, fmt.Errorf("BMC credentials file %s, line %d: want key=value (username=… or password=…)", path, n)
		case key == "username":
			c.Username = strings.TrimSpace(value)
		case key == "password":
			c.password = value
		case strings.EqualFold(key, "username") || strings.EqualFold(key, "password"):
			return Credentials{}, fmt.Errorf("BMC credentials file %s, line %d: keys are lowercase: username or password", path, n)
		default:
			// The key is not shown: a password written alone on its line may hold an =.
			return Credentials{}, fmt.Errorf("BMC credentials file %s, line %d: unknown key (not shown: it may be part of a secret); want username or password", path, n)
		}
	}
	if err := sc.Err(); err != nil {
		return Credentials{}, fmt.Errorf("BMC credentials file %s: %w", path, err)
	}
	return c.check(path)
}

// CredentialsFromEnv reads HALE_BMC_USERNAME and HALE_BMC_PASSWORD.
func CredentialsFromEnv() (Credentials, error) {
	c := Credentials{Username: os.Getenv(EnvUsername), password: os.Getenv(EnvPassword)}
	return c.check("the environment (" + EnvUsername + ", " + EnvPassword + ")")
}

func (c Credentials) check(from string) (Credentials, error) {
	var missing []string
	if c.Username == "" {
		missing = append(missing, "username")
	}
	if c.password == "" {
		missing = append(missing, "password")
	}
	if len(missing) > 0 {
		return Credentials{}, errors.New("BMC credentials from " + from + ": no " + strings.Join(missing, " and no "))
	}
	return c, nil
}
