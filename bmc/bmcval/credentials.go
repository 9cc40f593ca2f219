package bmcval

import (
	"fmt"
	"log/slog"
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
