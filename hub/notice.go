package hub

import (
	"context"
	"log/slog"
	"time"

	"github.com/hale-dev/hale/hub/pass"
)

// Say sends notices from outside the pass down the one event path (what the import of a degraded
// term recorded).
func (h *Hub) Say(ns ...pass.Notice) {
	for _, n := range ns {
		h.say(n)
	}
}

// say sends a notice down the one event path: a log line, the timeline, a metric and an Event.
func (h *Hub) say(n pass.Notice) {
	now := time.Now()
	level := slog.LevelInfo
	if n.Warning {
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{slog.String("reason", string(n.Reason))}
	if n.Machine != "" {
		attrs = append(attrs, slog.String("machine", n.Machine))
	}
	if n.Remediation != "" {
		attrs = append(attrs, slog.String("remediation", n.Remediation))
	}
	h.log.LogAttrs(context.Background(), level, n.Message, attrs...)
	if h.cfg.OnNotice != nil {
		h.cfg.OnNotice(now, n.Message)
	}
	h.mu.Lock()
	h.timeline = append(h.timeline, now.UTC().Format("15:04:05.000")+" "+n.Message)
	if len(h.timeline) > 1000 {
		h.timeline = h.timeline[len(h.timeline)-1000:]
	}
	h.mu.Unlock()
	h.metrics.Notice(n)
	if h.cfg.Notify != nil {
		h.cfg.Notify(n)
	}
}
