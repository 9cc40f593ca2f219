// Package logdedup passes memberlist's log lines, and the gossip's own complaints, to slog, warning
// once per kind of problem and peer.
package logdedup

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// Dedup takes memberlist's log lines and the gossip's own complaints and passes them to slog,
// warning only once per kind of problem and peer address: a peer with the wrong key or another
// cluster's label would otherwise fill the log several times a second.
type Dedup struct {
	log  *slog.Logger
	mu   sync.Mutex
	seen map[string]struct{}
	// undecryptable counts messages no installed key could decrypt: a peer on another key, or a key
	// rotation done out of order (see Gossip.SetKeys).
	undecryptable int
}

// maxDedup bounds the memory of what was already said; past it, everything may be said once more.
const maxDedup = 1024

// New returns a Dedup that logs to l.
func New(l *slog.Logger) *Dedup { return &Dedup{log: l, seen: map[string]struct{}{}} }

// Write receives one memberlist log line.
func (d *Dedup) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level, msg := slog.LevelDebug, line
	for tag, l := range map[string]slog.Level{"[ERR] ": slog.LevelWarn, "[WARN] ": slog.LevelWarn, "[INFO] ": slog.LevelInfo, "[DEBUG] ": slog.LevelDebug} {
		if i := strings.Index(line, tag); i >= 0 {
			level, msg = l, line[i+len(tag):]
			break
		}
	}
	msg = strings.TrimPrefix(msg, "memberlist: ")
	if level < slog.LevelWarn {
		d.log.Log(context.Background(), level, msg) // memberlist logs through an io.Writer: no context to pass
		return len(p), nil
	}
	peer := ""
	if i := strings.Index(msg, "from="); i >= 0 {
		peer = strings.Fields(msg[i+len("from="):] + " ")[0]
	}
	kind := msg
	if i := strings.IndexAny(kind, ":0123456789"); i > 0 {
		kind = kind[:i]
	}
	if strings.Contains(strings.ToLower(msg), "no installed keys could decrypt") {
		d.mu.Lock()
		d.undecryptable++
		d.mu.Unlock()
		msg += ": this peer encrypts with a key this member does not hold (another cluster's key, or a key " +
			"rotation out of order: add the new key second everywhere before moving it first)"
	}
	d.Once(kind, peer, msg)
	return len(p), nil
}

// Once logs msg as a warning the first time kind and peer are seen together.
func (d *Dedup) Once(kind, peer, msg string, args ...any) {
	d.mu.Lock()
	key := kind + "\x00" + peer
	_, dup := d.seen[key]
	if !dup {
		if len(d.seen) >= maxDedup {
			clear(d.seen)
		}
		d.seen[key] = struct{}{}
	}
	d.mu.Unlock()
	if !dup {
		if peer != "" {
			args = append(args, "peer", peer)
		}
		d.log.Warn(msg+" (said once per peer)", args...)
	}
}

// Undecryptable counts the messages no installed key could decrypt so far.
func (d *Dedup) Undecryptable() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.undecryptable
}
