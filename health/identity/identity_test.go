package identity

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadOrCreateIdentity(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hale", "identity.key")
	id, created, err := LoadOrCreateIdentity(path)
	require.NoError(t, err)
	assert.True(t, created)
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	again, created, err := LoadOrCreateIdentity(path)
	require.NoError(t, err)
	assert.False(t, created, "kept, not made anew")
	assert.Equal(t, id.Public().String(), again.Public().String())
	k, err := ParsePublicKey(id.Public().String())
	require.NoError(t, err)
	assert.Equal(t, id.Public(), k)

	require.NoError(t, os.Chmod(path, 0o644))
	_, _, err = LoadOrCreateIdentity(path)
	require.ErrorContains(t, err, "other users may read it")
	bad := filepath.Join(dir, "bad.key")
	require.NoError(t, os.WriteFile(bad, []byte("not a key\n"), 0o600))
	_, _, err = LoadOrCreateIdentity(bad)
	require.ErrorContains(t, err, bad+": not a PEM PRIVATE KEY")
}

func TestLoadPinned(t *testing.T) {
	a, b, c := NewIdentity().Public(), NewIdentity().Public(), NewIdentity().Public()
	dir := t.TempDir()
	for _, tc := range []struct {
		name, body, err string
	}{
		{name: "ok", body: "# the control plane\ncp-0 " + a.String() + "\ncp-1 " + b.String() + " # rotated in May\ncp-1 " + c.String() + "\nhub-* " + c.String() + "\n"},
		{name: "one field", body: "cp-0\n", err: "line 1: want NAME ed25519:BASE64"},
		{name: "not a key", body: "\ncp-0 ssh-ed25519 AAAA\n", err: "line 2: want NAME ed25519:BASE64"},
		{name: "bad base64", body: "cp-0 ed25519:!!!\n", err: `line 1: "ed25519:!!!" is not ed25519: followed by the base64 of 32 bytes`},
		{name: "three keys", body: "cp-0 " + a.String() + "\ncp-0 " + b.String() + "\ncp-0 " + c.String() + "\n", err: "line 3: cp-0 has two keys already"},
		{name: "a star inside", body: "c*p " + a.String() + "\n", err: "* may only end a name"},
		{name: "empty", body: "# nothing\n", err: "no key in it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			require.NoError(t, os.WriteFile(path, []byte(tc.body), 0o644))
			p, err := LoadPinned(path)
			if tc.err != "" {
				require.ErrorContains(t, err, path)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, []PublicKey{a}, p.Keys("cp-0"))
			assert.Equal(t, []PublicKey{b, c}, p.Keys("cp-1"))
			assert.Equal(t, []PublicKey{c}, p.Keys("hub-ctl-1-x7k2q9"))
			assert.Empty(t, p.Keys("cp-9"))
		})
	}
}
