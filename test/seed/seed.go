// Package seed gives randomized tests a seed that is logged, and replayable with HALE_SEED.
package seed

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// FromEnv returns HALE_SEED when it is set (to replay a failure), else a fresh seed that it logs.
func FromEnv(tb testing.TB) uint64 {
	tb.Helper()
	if s := os.Getenv("HALE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			tb.Fatalf("HALE_SEED=%q: want an unsigned integer", s)
		}
		return v
	}
	v := uint64(time.Now().UnixNano())
	tb.Logf("seed %d (replay with HALE_SEED=%d)", v, v)
	return v
}
