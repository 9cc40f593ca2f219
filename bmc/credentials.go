package bmc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/internal/secretfile"
)

// Credentials are a BMC user name and password (bmcval.Credentials): every way of printing them
// redacts the password.
type Credentials = bmcval.Credentials

// NewCredentials returns credentials for username and password.
func NewCredentials(username, password string) Credentials {
	return bmcval.NewCredentials(username, password)
}

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
		var user, password string
		for name, dst := range map[string]*string{"username": &user, "password": &password} {
			b, err := secretfile.Read(filepath.Join(path, name))
			if err != nil {
				return Credentials{}, fmt.Errorf("BMC credentials directory %s: %w (want files username and password)", path, err)
			}
			*dst = strings.TrimRight(string(b), "\r\n")
		}
		return checkCredentials(NewCredentials(user, password), path)
	}
	b, err := secretfile.Read(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("BMC credentials: %w", err)
	}
	var user, password string
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
			user = strings.TrimSpace(value)
		case key == "password":
			password = value
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
	return checkCredentials(NewCredentials(user, password), path)
}

// CredentialsFromEnv reads HALE_BMC_USERNAME and HALE_BMC_PASSWORD.
func CredentialsFromEnv() (Credentials, error) {
	return checkCredentials(NewCredentials(os.Getenv(EnvUsername), os.Getenv(EnvPassword)), "the environment ("+EnvUsername+", "+EnvPassword+")")
}

// checkCredentials returns c when it has both a user name and a password; from says where they came from.
func checkCredentials(c Credentials, from string) (Credentials, error) {
	var missing []string
	if c.Username == "" {
		missing = append(missing, "username")
	}
	if c.Password() == "" {
		missing = append(missing, "password")
	}
	if len(missing) > 0 {
		return Credentials{}, errors.New("BMC credentials from " + from + ": no " + strings.Join(missing, " and no "))
	}
	return c, nil
}
