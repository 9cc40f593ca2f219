package health

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/health/identity"
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
	return ParseGossipKeys(raw, "gossip key file "+path)
}

// ParseGossipKeys reads keys as a key file holds them (one base64 key a line, the first encrypts);
// where names their source in an error (never a key).
func ParseGossipKeys(raw []byte, where string) ([][]byte, error) {
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("%s, line %d: not base64 (make a key with: head -c 32 /dev/urandom | base64)", where, n)
		}
		if l := len(k); l != 16 && l != 24 && l != 32 {
			return nil, fmt.Errorf("%s, line %d: the key is %d bytes; want 32 (or 16 or 24)", where, n, l)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no key in it; encryption is mandatory (make one with: head -c 32 /dev/urandom | base64)", where)
	}
	return keys, nil
}

// DefaultKeyAdoptDelay is how long a member holds a key the key file newly makes primary before it
// encrypts with it (KeyAdoptDelay): longer than the kubelet takes to bring a changed Secret to every
// node (its sync period, a minute, plus its cache), so that every member can read the new key before
// any member writes with it.
const DefaultKeyAdoptDelay = 2 * time.Minute

// SetKeys replaces the keyring with a key file's new content: the first key encrypts, all decrypt.
// The safe rotation is three steps, each on every member before the next: add the new key second,
// move it first, drop the old one. A member that encrypts with a key a peer does not hold cannot be
// heard by that peer and looks dead to it, so when the file makes first a key this member did not
// hold (the first step skipped), the key is added at once but used for encryption only KeyAdoptDelay
// later, and that is said loudly; unless the file also drops the key in use, which leaves no choice.
func (g *Gossip) SetKeys(keys [][]byte) error {
	if len(keys) == 0 {
		return errors.New("gossip keys: none given; encryption is mandatory")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	kr := g.keyring
	has := func(set [][]byte, k []byte) bool {
		return slices.ContainsFunc(set, func(o []byte) bool { return bytes.Equal(o, k) })
	}
	held, primary := kr.GetKeys(), kr.GetPrimaryKey()
	for _, k := range keys {
		if err := kr.AddKey(k); err != nil {
			return fmt.Errorf("gossip keys: %w", err)
		}
	}
	if g.adopt != nil {
		g.adopt.Stop()
		g.adopt = nil
	}
	switch want := keys[0]; {
	case bytes.Equal(want, primary):
	case has(held, want) || g.cfg.KeyAdoptDelay <= 0:
		if err := kr.UseKey(want); err != nil {
			return fmt.Errorf("gossip keys: %w", err)
		}
	case !has(keys, primary):
		if err := kr.UseKey(want); err != nil {
			return fmt.Errorf("gossip keys: %w", err)
		}
		g.keyOrder++
		g.log.Error("gossip keys: the key file makes first a key this member did not hold and drops the key it encrypted with; " +
			"members that do not hold the new key yet cannot hear this one and will see it dead until they do. " +
			"Rotate in three steps, each on every member: add the new key second, move it first, drop the old one")
	default:
		g.keyOrder++
		g.log.Error("gossip keys: the key file makes first a key this member did not hold: it decrypts with it now and "+
			"encrypts with it from "+time.Now().Add(g.cfg.KeyAdoptDelay).UTC().Format(time.RFC3339)+", so that members "+
			"which have not read the file yet can still hear it. Rotate in three steps, each on every member: "+
			"add the new key second, move it first, drop the old one", "delay", g.cfg.KeyAdoptDelay)
		g.adopt = time.AfterFunc(g.cfg.KeyAdoptDelay, func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if has(kr.GetKeys(), want) && kr.UseKey(want) == nil {
				g.log.Info("gossip keys: now encrypting with the key the key file made first")
			}
		})
	}
	for _, old := range kr.GetKeys() {
		if !has(keys, old) && !bytes.Equal(old, kr.GetPrimaryKey()) {
			if err := kr.RemoveKey(old); err != nil {
				return fmt.Errorf("gossip keys: %w", err)
			}
		}
	}
	return nil
}

// KeyOrderErrors counts key file changes that made first a key this member did not hold (a rotation
// out of order: see SetKeys).
func (g *Gossip) KeyOrderErrors() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.keyOrder
}

// KeyFileCheck is how often agents and the hub read their gossip key file again (WatchKeyFile).
const KeyFileCheck = 5 * time.Second

// WatchKeyFile reloads the gossip keys from path whenever its content changes (a mounted Secret is
// updated in place), checking every interval until ctx ends. A file that cannot be read or holds no
// valid key is reported and changes nothing: the keys in force stay.
func (g *Gossip) WatchKeyFile(ctx context.Context, path string, interval time.Duration) {
	g.watch(ctx, path, interval, "gossip keys", func() (int, error) {
		keys, err := LoadGossipKeys(path)
		if err == nil {
			err = g.SetKeys(keys)
		}
		return len(keys), err
	})
}

// WatchPinnedFile reloads the pinned keys from path whenever its content changes (a member added or
// re-keyed; a mounted ConfigMap is updated in place), as WatchKeyFile does the gossip keys.
func (g *Gossip) WatchPinnedFile(ctx context.Context, path string, interval time.Duration) {
	g.watch(ctx, path, interval, "pinned keys", func() (int, error) {
		p, err := identity.LoadPinned(path)
		if err == nil {
			g.SetPinned(p)
		}
		return p.Len(), err
	})
}

// watch calls load whenever the file at path holds something else than when load last succeeded,
// every interval until ctx ends (the first check loads it again: it may have changed since the start,
// and loading what is in force changes nothing). A failure is reported once and changes nothing: what
// is in force stays.
func (g *Gossip) watch(ctx context.Context, path string, interval time.Duration, what string, load func() (int, error)) {
	var last []byte
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		raw, err := os.ReadFile(path)
		if err == nil && last != nil && bytes.Equal(raw, last) {
			continue
		}
		n := 0
		if err == nil {
			n, err = load()
		}
		if err != nil {
			g.dedup.Once(what, err.Error(), what+": the file cannot be used; what is in force stays", "file", path, "err", err)
			continue
		}
		if last != nil {
			g.log.Info(what+": reloaded the file", "file", path, "entries", n)
		}
		last = raw
	}
}

// SetPinned replaces the keys signatures are checked against (a changed pinned-keys file: a member
// added or re-keyed). Reports and alive messages already taken stay.
func (g *Gossip) SetPinned(p identity.Pinned) {
	g.mu.Lock()
	g.pinned = p
	g.mu.Unlock()
}
