package bmc

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in      string
		want    Endpoint
		str     string
		wantErr string
	}{
		{in: "redfish://10.0.0.5", want: Endpoint{Driver: DriverRedfish, Host: "10.0.0.5", Port: 443}, str: "redfish://10.0.0.5:443"},
		{in: "redfish://bmc-1.example:8443/systems/System.Embedded.1",
			want: Endpoint{Driver: DriverRedfish, Host: "bmc-1.example", Port: 8443, SystemID: "System.Embedded.1"},
			str:  "redfish://bmc-1.example:8443/systems/System.Embedded.1"},
		{in: "redfish://10.0.0.5/redfish/v1/Systems/1", want: Endpoint{Driver: DriverRedfish, Host: "10.0.0.5", Port: 443, SystemID: "1"}},
		{in: "redfish+https://10.0.0.5", want: Endpoint{Driver: DriverRedfish, Host: "10.0.0.5", Port: 443}},
		{in: "redfish+http://10.0.0.5", want: Endpoint{Driver: DriverRedfish, Host: "10.0.0.5", Port: 80, PlainHTTP: true}, str: "redfish+http://10.0.0.5:80"},
		{in: "ipmi://10.0.0.6", want: Endpoint{Driver: DriverIPMI, Host: "10.0.0.6", Port: 623}, str: "ipmi://10.0.0.6:623"},
		{in: "ipmi://[fd00::6]:6230", want: Endpoint{Driver: DriverIPMI, Host: "fd00::6", Port: 6230}, str: "ipmi://[fd00::6]:6230"},
		{in: "10.0.0.5", wantErr: `BMC endpoint "10.0.0.5": want redfish://host[:port][/systems/ID], redfish+http://… or ipmi://host[:port]`},
		{in: "idrac-redfish://10.0.0.5/redfish/v1/Systems/System.Embedded.1",
			want: Endpoint{Driver: DriverRedfish, Host: "10.0.0.5", Port: 443, SystemID: "System.Embedded.1"}, str: "redfish://10.0.0.5:443/systems/System.Embedded.1"},
		{in: "redfish-virtualmedia+http://10.0.0.5:8000/redfish/v1/Systems/1",
			want: Endpoint{Driver: DriverRedfish, Host: "10.0.0.5", Port: 8000, SystemID: "1", PlainHTTP: true}},
		{in: "idrac-virtualmedia+https://10.0.0.5", want: Endpoint{Driver: DriverRedfish, Host: "10.0.0.5", Port: 443}},
		{in: "ilo5-redfish://10.0.0.5", want: Endpoint{Driver: DriverRedfish, Host: "10.0.0.5", Port: 443}},
		{in: "idrac://10.0.0.5", wantErr: `unknown scheme "idrac"; want redfish (redfish+https), redfish+http, ipmi, or one of metal3's Redfish schemes (idrac-redfish, `},
		{in: "redfish+ftp://10.0.0.5", wantErr: `unknown scheme "redfish+ftp"`},
		{in: "ipmi+http://10.0.0.5", wantErr: `unknown scheme "ipmi+http"`},
		{in: "redfish://10.0.0.5:99999", wantErr: `port "99999" is not a number from 1 to 65535`},
		{in: "ipmi://10.0.0.5/x", wantErr: "an ipmi endpoint has no path"},
		{in: "redfish://10.0.0.5/chassis/1", wantErr: `path "/chassis/1": want /systems/ID or /redfish/v1/Systems/ID`},
		{in: "redfish://admin:TopSecret@10.0.0.5", wantErr: "credentials in the URL are not accepted"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseEndpoint(tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				assert.NotContains(t, err.Error(), "TopSecret")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			if tt.str != "" {
				assert.Equal(t, tt.str, got.String())
			}
		})
	}
}

func TestLoadCredentials(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	secretDir := filepath.Join(dir, "secret")
	require.NoError(t, os.Mkdir(secretDir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(secretDir, "username"), []byte("root\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(secretDir, "password"), []byte("p@ss word=\n"), 0o600))
	halfDir := filepath.Join(dir, "half")
	require.NoError(t, os.Mkdir(halfDir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(halfDir, "username"), []byte("root"), 0o600))

	tests := []struct {
		name     string
		path     string
		user     string
		password string
		wantErr  string
	}{
		{name: "key=value file", path: write("ok", "# bmc\nusername = admin\npassword=a=b c\n"), user: "admin", password: "a=b c"},
		{name: "secret directory", path: secretDir, user: "root", password: "p@ss word="},
		{name: "directory without password", path: halfDir, wantErr: "want files username and password"},
		{name: "no password", path: write("nopw", "username=admin\n"), wantErr: "no password"},
		{name: "unknown key", path: write("bad", "user=admin\n"), wantErr: `line 1: unknown key (not shown: it may be part of a secret); want username or password`},
		{name: "a key in capitals", path: write("caps", "Password=x\n"), wantErr: `line 1: keys are lowercase`},
		{name: "not key=value", path: write("junk", "admin\n"), wantErr: "line 1: want key=value"},
		{name: "missing file", path: filepath.Join(dir, "none"), wantErr: "no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := LoadCredentials(tt.path)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.user, c.Username)
			assert.Equal(t, tt.password, c.Password())
		})
	}

	t.Setenv(EnvUsername, "envuser")
	t.Setenv(EnvPassword, "envpass")
	c, err := CredentialsFromEnv()
	require.NoError(t, err)
	assert.Equal(t, "envpass", c.Password())
	t.Setenv(EnvPassword, "")
	_, err = CredentialsFromEnv()
	require.EqualError(t, err, "BMC credentials from the environment (HALE_BMC_USERNAME, HALE_BMC_PASSWORD): no password")
}

// Every way of printing credentials hides the password.
func TestCredentialsAreRedacted(t *testing.T) {
	c := NewCredentials("admin", secret)
	var out bytes.Buffer
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		fmt.Fprintf(&out, verb+"\n", c)
	}
	fmt.Fprintf(&out, "%v %+v\n", struct{ C Credentials }{c}, &c)
	slog.New(slog.NewJSONHandler(&out, nil)).Info("x", "creds", c)
	slog.New(slog.NewTextHandler(&out, nil)).Info("x", "creds", c)
	assert.NotContains(t, out.String(), secret)
	assert.Contains(t, out.String(), `user "admin", password redacted`)
}
