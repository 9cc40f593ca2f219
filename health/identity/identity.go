// Package identity is the gossip members' identities: each member's Ed25519 key of its own, the keys
// pinned for each name, and an agent's enrolment of its key through the API server. A member signs
// every report it publishes and the claim in its gossip metadata that binds its name to its address,
// and every member verifies both against the keys pinned for that name (Pinned) before it takes a
// report or lets the name be alive (package health does both). The shared gossip key keeps outsiders
// out; the identities keep a holder of the shared key from speaking for another member: a stolen pool
// key is no longer enough to make a healthy machine look failed, to take its name over while its
// agent restarts, or to answer for it once it is dead.
package identity

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/hale-dev/hale/internal/secretfile"
)

// Identity is this member's signing key.
type Identity struct {
	key ed25519.PrivateKey
}

// Public is the identity's public key, as the pinned-keys file writes it.
func (id Identity) Public() PublicKey { return PublicKey(id.key.Public().(ed25519.PublicKey)) }

// Sign signs msg (a report, a claim) with the identity's key.
func (id Identity) Sign(msg []byte) []byte { return ed25519.Sign(id.key, msg) }

// NewIdentity returns a fresh identity (tests, and LoadOrCreateIdentity).
func NewIdentity() Identity {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(fmt.Sprintf("ed25519: %v", err)) // crypto/rand does not fail on Linux
	}
	return Identity{key: key}
}

// LoadOrCreateIdentity reads the identity key at path (a PKCS#8 PEM private key, as `openssl genpkey
// -algorithm ed25519` writes it), or, when there is no file there, creates one (mode 0600, in a
// directory created 0700) and says so. A key file others may read is refused, as the BMC credentials
// and gossip keys are. Errors name the file, never the key.
func LoadOrCreateIdentity(path string) (id Identity, created bool, err error) {
	raw, err := secretfile.Read(path)
	if errors.Is(err, fs.ErrNotExist) {
		id = NewIdentity()
		der, err := x509.MarshalPKCS8PrivateKey(id.key)
		if err != nil {
			return Identity{}, false, fmt.Errorf("identity key %s: %w", path, err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return Identity{}, false, fmt.Errorf("identity key %s: %w", path, err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return Identity{}, false, fmt.Errorf("identity key %s: creating it: %w", path, err)
		}
		werr := pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
		if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
			return Identity{}, false, fmt.Errorf("identity key %s: writing it: %w", path, err)
		}
		return id, true, nil
	}
	if err != nil {
		return Identity{}, false, fmt.Errorf("identity key: %w", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != "PRIVATE KEY" {
		return Identity{}, false, fmt.Errorf("identity key %s: not a PEM PRIVATE KEY (make one with: openssl genpkey -algorithm ed25519, or remove the file and the agent creates one)", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return Identity{}, false, fmt.Errorf("identity key %s: %w", path, err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return Identity{}, false, fmt.Errorf("identity key %s: a %T key; Hale's identities are Ed25519", path, k)
	}
	return Identity{key: key}, false, nil
}

// EnrolmentRequest is this identity's certificate request for name (its node): a PEM CSR with the
// identity's public key, the name as its common name, signed with the identity's key (proof that the
// requester holds it). In Kubernetes mode an agent enrols with it (a CertificateSigningRequest the hub
// approves by pinning the key; no certificate is issued).
func (id Identity) EnrolmentRequest(name string) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, id.key)
	if err != nil {
		return nil, fmt.Errorf("identity: making the enrolment request for %s: %w", name, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// Fingerprint is a short name of the key (lower-case hex of its first 8 bytes' SHA-256), for object names.
func (k PublicKey) Fingerprint() string {
	sum := sha256.Sum256(k)
	return hex.EncodeToString(sum[:8])
}

// PublicKey is a member's Ed25519 public key.
type PublicKey ed25519.PublicKey

const keyPrefix = "ed25519:"

// String is the key as the pinned-keys file writes it: ed25519:BASE64.
func (k PublicKey) String() string { return keyPrefix + base64.StdEncoding.EncodeToString(k) }

// ParsePublicKey reads a key written as ed25519:BASE64.
func ParsePublicKey(s string) (PublicKey, error) {
	b64, ok := strings.CutPrefix(s, keyPrefix)
	if !ok {
		return nil, fmt.Errorf("%q is not ed25519:BASE64", s)
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%q is not ed25519: followed by the base64 of %d bytes", s, ed25519.PublicKeySize)
	}
	return PublicKey(b), nil
}

// Verify says whether sig is msg signed by k.
func (k PublicKey) Verify(msg, sig []byte) bool {
	return len(sig) == ed25519.SignatureSize && ed25519.Verify(ed25519.PublicKey(k), msg, sig)
}

// Pinned are the public keys each member may sign with, by name: up to two per name (during a key
// rotation the old and the new). A name ending in * stands for every name it begins (the hub, whose
// name is new at each start: hub-*).
type Pinned struct {
	exact    map[string][]PublicKey
	prefixes []pinnedPrefix
}

type pinnedPrefix struct {
	prefix string
	keys   []PublicKey
}

// PinnedOf pins keys by name (tests, and members that build the set in code).
func PinnedOf(keys map[string][]PublicKey) Pinned {
	p := Pinned{exact: map[string][]PublicKey{}}
	for name, ks := range keys {
		p.add(name, ks...)
	}
	return p
}

func (p *Pinned) add(name string, keys ...PublicKey) {
	if prefix, ok := strings.CutSuffix(name, "*"); ok {
		for i := range p.prefixes {
			if p.prefixes[i].prefix == prefix {
				p.prefixes[i].keys = append(p.prefixes[i].keys, keys...)
				return
			}
		}
		p.prefixes = append(p.prefixes, pinnedPrefix{prefix, keys})
		return
	}
	if p.exact == nil {
		p.exact = map[string][]PublicKey{}
	}
	p.exact[name] = append(p.exact[name], keys...)
}

// Keys are the keys pinned for name: its own entry's, else those of the longest prefix that matches.
func (p Pinned) Keys(name string) []PublicKey {
	if ks, ok := p.exact[name]; ok {
		return ks
	}
	var best pinnedPrefix
	for _, pp := range p.prefixes {
		if strings.HasPrefix(name, pp.prefix) && len(pp.prefix) >= len(best.prefix) {
			best = pp
		}
	}
	return best.keys
}

// Len counts the names pinned (prefixes included).
func (p Pinned) Len() int { return len(p.exact) + len(p.prefixes) }

// Verify says whether sig is msg signed by a key pinned for name, and if not why (a Reject reason).
func (p Pinned) Verify(name string, msg, sig []byte) (ok bool, reason string) {
	keys := p.Keys(name)
	if len(keys) == 0 {
		return false, RejectUnknownNode
	}
	for _, k := range keys {
		if k.Verify(msg, sig) {
			return true, ""
		}
	}
	return false, RejectBadSignature
}

// LoadPinned reads a pinned-keys file: one member a line, its name and its key (NAME ed25519:BASE64),
// # for comments; a name may have two lines while its key is rotated; hub-* pins the hub's key for
// every name the hub takes. Errors name the file and line; a file with no key is an error.
func LoadPinned(path string) (Pinned, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Pinned{}, fmt.Errorf("pinned keys: %w", err)
	}
	p, err := ParsePinned(raw, path)
	if err == nil && p.Len() == 0 {
		err = fmt.Errorf("pinned keys %s: no key in it (`agent identity` prints a member's line)", path)
	}
	return p, err
}

// ParsePinned reads pinned keys in the pinned-keys file's format; source names where they come from
// in errors. No line: no key pinned (every signature refused).
func ParsePinned(raw []byte, source string) (Pinned, error) {
	lines, err := ParsePinLines(raw, source)
	var p Pinned
	for _, l := range lines {
		p.add(l.Name, l.Key)
	}
	return p, err
}

// PinLine is one line of a pinned-keys file: a name (or a prefix ending in *) and its key.
type PinLine struct {
	Name string
	Key  PublicKey
}

func (l PinLine) String() string { return l.Name + " " + l.Key.String() }

// ParsePinLines reads the lines of a pinned-keys file, in order.
func ParsePinLines(raw []byte, source string) ([]PinLine, error) {
	var out []PinLine
	count := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
			continue
		case len(f) != 2:
			return nil, fmt.Errorf("pinned keys %s, line %d: want NAME ed25519:BASE64 (`agent identity` prints a member's line)", source, n)
		case strings.Contains(strings.TrimSuffix(f[0], "*"), "*"):
			return nil, fmt.Errorf("pinned keys %s, line %d: %q: * may only end a name (hub-*)", source, n, f[0])
		}
		k, err := ParsePublicKey(f[1])
		if err != nil {
			return nil, fmt.Errorf("pinned keys %s, line %d: %w", source, n, err)
		}
		if count[f[0]]++; count[f[0]] > 2 {
			return nil, fmt.Errorf("pinned keys %s, line %d: %s has two keys already (the old and the new, while rotating); drop the old one first", source, n, f[0])
		}
		out = append(out, PinLine{f[0], k})
	}
	return out, sc.Err()
}

// FormatPinLines writes lines in the pinned-keys file's format, under a comment saying who keeps them.
func FormatPinLines(header string, lines []PinLine) string {
	var b strings.Builder
	for l := range strings.SplitSeq(header, "\n") {
		b.WriteString("# " + l + "\n")
	}
	for _, l := range lines {
		b.WriteString(l.String() + "\n")
	}
	return b.String()
}

// AliveClaim is what a member's gossip metadata signs: its pool, name and address, its role and when
// it started. Bound to the address, it cannot be used from another; bound to the start, a new process
// makes a new one.
func AliveClaim(cluster, name, addr, role string, started int64) []byte {
	return fmt.Appendf(nil, "hale-alive\x00%s\x00%s\x00%s\x00%s\x00%d", cluster, name, addr, role, started)
}

// Reasons a member's signature is refused (reports and alive claims; Rejected's keys).
const (
	RejectUnsigned     = "unsigned"      // no signature, while this member requires them
	RejectUnknownNode  = "unknown_node"  // no key pinned for the name it gives
	RejectBadSignature = "bad_signature" // not signed by a key pinned for that name
)

// IdentitiesOff is what a stolen gossip key allows a member without identities: said when an
// operator turns them off, and in the error that asks for the files.
const IdentitiesOff = "any holder of the gossip key can then speak for any member: make a healthy machine's reports say it failed (and have it power-cycled), or answer for a dead one"

// CheckIdentitySettings says what is wrong with a member's identity settings: both files, or
// identities turned off (setting names how), and not both.
func CheckIdentitySettings(identityFile, pinnedFile string, off bool, setting string) error {
	switch {
	case off && (identityFile != "" || pinnedFile != ""):
		return fmt.Errorf("%s, and an identity or pinned-keys file: identities are either on (the files) or off (%s), not both", setting, setting)
	case off:
		return nil
	case identityFile == "" && pinnedFile == "":
		return fmt.Errorf("per-node identities are on by default: give this member's identity file and every member's pinned keys (docs/identities.md), or turn them off with %s: %s", setting, IdentitiesOff)
	case identityFile == "" || pinnedFile == "":
		return errors.New("an identity file and a pinned-keys file go together: set both")
	}
	return nil
}

// LoadIdentities loads this member's identity (creating it when missing) and the pinned keys. Both
// files are needed, unless off says the operator turned identities off (setting names how): then
// neither, nil, nil and a warning. A member whose own key is not pinned for its name is warned, not
// stopped: the others refuse it until the pinned-keys file holds its line (which the warning gives),
// and the file is read again when it changes. pinAs is the name its line pins (node, or a prefix of it:
// hub-*).
func LoadIdentities(node, pinAs, identityFile, pinnedFile string, off bool, setting string, log *slog.Logger) (*Identity, *Pinned, error) {
	if err := CheckIdentitySettings(identityFile, pinnedFile, off, setting); err != nil {
		return nil, nil, err
	}
	if off {
		log.Warn("gossip identities are off ("+setting+"): "+IdentitiesOff, "setting", setting)
		return nil, nil, nil
	}
	id, created, err := LoadOrCreateIdentity(identityFile)
	if err != nil {
		return nil, nil, err
	}
	line := pinAs + " " + id.Public().String()
	if created {
		log.Info("created this member's identity key; add its line to the pinned-keys file of every member", "file", identityFile, "line", line)
	}
	pinned, err := LoadPinned(pinnedFile)
	if err != nil {
		return nil, nil, err
	}
	if !pinnedFor(pinned, node, id.Public()) {
		log.Warn("this member's key is not pinned for its name: the other members refuse it until the pinned-keys file holds this line",
			"pinnedFile", pinnedFile, "line", line)
	}
	return &id, &pinned, nil
}
