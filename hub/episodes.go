package hub

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/hale-dev/hale/hub/pass"
)

// What the hub keeps of the episodes (pass/episode.go): the last few of each machine, in memory for
// `hub explain` and in an EpisodeStore across restarts, written beside the passes (the latest log at a
// time); and each one counted as it ends (hale_hub_episodes_total, hale_hub_episode_seconds).

// keepEpisodes is how many episodes per machine are kept.
const keepEpisodes = 10

// EpisodeStore keeps the episodes' log across hub restarts: the journal does (Journal.Episodes), and
// in Kubernetes mode the HealthPolicy.
type EpisodeStore interface {
	Episodes(ctx context.Context) (pass.EpisodeLog, error)
	RecordEpisodes(ctx context.Context, log pass.EpisodeLog) error
}

// loadEpisodes reads the episodes' log the store kept (none without a store). A log that cannot be
// read is said and started afresh: it explains, it decides nothing.
func (h *Hub) loadEpisodes(ctx context.Context) {
	if h.cfg.Episodes == nil {
		return
	}
	l, err := h.cfg.Episodes.Episodes(ctx)
	if err != nil {
		h.log.Warn("reading the episodes' log: starting it afresh", "err", err)
		return
	}
	h.mu.Lock()
	h.episodes = l
	h.mu.Unlock()
}

// followEpisodes sets the machines whose BMCs the proof watch reads (watch; nil: unchanged) and
// counts and logs the episodes a pass saw end.
func (h *Hub) followEpisodes(watch []string, ended []pass.Episode) {
	if watch != nil {
		h.watch(watch)
	}
	h.ended(ended)
}

// ended counts the episodes a pass saw end and adds them to the log, which is handed to the writer.
func (h *Hub) ended(episodes []pass.Episode) {
	if len(episodes) == 0 {
		return
	}
	h.mu.Lock()
	l := maps.Clone(h.episodes)
	if l == nil {
		l = pass.EpisodeLog{}
	}
	for _, e := range episodes {
		h.metrics.Episode(e)
		kept := append(slices.Clone(l[e.Machine]), e)
		l[e.Machine] = kept[max(0, len(kept)-keepEpisodes):]
	}
	h.episodes = l
	h.mu.Unlock()
	if h.cfg.Episodes != nil {
		h.episodeLog.post(l)
	}
}

// Episodes are a machine's last episodes, oldest first.
func (h *Hub) Episodes(machine string) []pass.Episode {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.episodes[machine])
}

// recordEpisodes writes the log to the store; a failed write is logged and the next ended episode
// writes the whole log again.
func (h *Hub) recordEpisodes(ctx context.Context, l pass.EpisodeLog) error {
	err := h.cfg.Episodes.RecordEpisodes(ctx, l)
	if err != nil && ctx.Err() == nil {
		h.log.Warn("journaling the episodes' log: it is kept in memory until the next episode ends", "err", err)
	}
	return err
}

// watchProofs reads, every ProofWatch, the BMC of each machine the latest pass wants watched (dead,
// within its stall tolerance: pass/stall.go) for proof of a hang, as a readiness check does
// (checkBMCsOf): the next pass finds what it read in the hub's BMC findings. A machine newly watched
// is read at once: a kernel panic's entry in its event log then proves the hang within a second.
func (h *Hub) watchProofs(ctx context.Context) {
	for {
		h.mu.Lock()
		names := h.watching
		h.mu.Unlock()
		if len(names) > 0 {
			inv := h.inventory()
			var ms []pass.Machine
			for _, m := range inv.Machines {
				if slices.Contains(names, m.Name) {
					ms = append(ms, m)
				}
			}
			h.checkBMCsOf(ctx, inv, ms, false)
		}
		select {
		case <-ctx.Done():
			return
		case <-h.watchWake:
		case <-time.After(h.cfg.ProofWatch):
		}
	}
}

// watch sets the machines whose BMCs watchProofs reads, and wakes it.
func (h *Hub) watch(names []string) {
	h.mu.Lock()
	h.watching = names
	h.mu.Unlock()
	select {
	case h.watchWake <- struct{}{}:
	default:
	}
}
