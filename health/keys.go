package health

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/hale-dev/hale/internal/secretfile"
)

// LoadGossipKeys reads gossip encryption keys from path: one base64 key per line (32 bytes decoded;
// 16 and 24 are accepted), # for comments. The first key encrypts; every key decrypts, which is how a
// key is rotated (add the new key second everywhere, then move it first, then drop the old one).
// Errors name the file and line, never a key.
func LoadGossipKeys(path string) ([][]byte, error) {
	raw, err := secretfile.Read(path)
	if err != nil {
		return nil, fmt.Errorf("gossip key file: %w", err)
	}
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("gossip key file %s, line %d: not base64 (make a key with: head -c 32 /dev/urandom | base64)", path, n)
		}
		if l := len(k); l != 16 && l != 24 && l != 32 {
			return nil, fmt.Errorf("gossip key file %s, line %d: the key is %d bytes; want 32 (or 16 or 24)", path, n, l)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("gossip key file %s: no key in it; encryption is mandatory (make one with: head -c 32 /dev/urandom | base64)", path)
	}
	return keys, nil
}
