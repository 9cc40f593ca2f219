package identity

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An enrolment request the API server did not take is made again at the next read of the pinned keys,
// not a minute later; one it took is not made again meanwhile.
func TestEnrolmentAsksAgainWhenTheRequestFailed(t *testing.T) {
	var mu sync.Mutex
	var posts []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			_, _ = w.Write([]byte(`{"data":{}}`)) // nothing pinned yet
			return
		}
		mu.Lock()
		posts = append(posts, time.Now())
		n := len(posts)
		mu.Unlock()
		if n == 1 { // an API server that does not answer yet
			http.Error(w, `{"message":"etcdserver: request timed out"}`, http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	e := &Enrolment{Server: srv.URL, Client: srv.Client(), Namespace: "hale-system", ConfigMap: PinnedConfigMap, Node: "cp-0",
		Identity: NewIdentity(), Copy: filepath.Join(t.TempDir(), "pinned-keys"), Log: slog.New(slog.DiscardHandler)}
	e.Start()
	go e.Run(t.Context(), func(Pinned) {})
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(posts) }
	require.Eventually(t, func() bool { return count() >= 2 }, 4*EnrolmentInterval, 50*time.Millisecond, "asked again after the failure")
	mu.Lock()
	again := posts[1].Sub(posts[0])
	mu.Unlock()
	assert.Less(t, again, 2*EnrolmentInterval, "asked again at the next read")
	time.Sleep(2 * EnrolmentInterval)
	assert.Equal(t, 2, count(), "a request the API server took is not made again within enrolAgain")
}
