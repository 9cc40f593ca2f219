// Package lossy is a memberlist transport that drops a share of the UDP packets a member sends and
// receives, seeded so that a failing run can be replayed. TCP (push/pull, TCP probes) is left alone,
// as on a real lossy link where TCP retransmits.
package lossy

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Transport drops packets at random.
type Transport struct {
	memberlist.NodeAwareTransport
	mu   sync.Mutex
	rng  *rand.Rand
	loss float64
	in   chan *memberlist.Packet
}

// Wrap drops loss (0..1) of the packets inner sends and receives.
func Wrap(inner memberlist.NodeAwareTransport, loss float64, seed uint64) *Transport {
	t := &Transport{NodeAwareTransport: inner, rng: rand.New(rand.NewPCG(seed, 1)), loss: loss, in: make(chan *memberlist.Packet, 256)}
	go func() {
		for p := range inner.PacketCh() {
			if !t.drop() {
				t.in <- p
			}
		}
	}()
	return t
}

func (t *Transport) drop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rng.Float64() < t.loss
}

// PacketCh returns the packets that were not dropped.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.in }

// WriteTo sends b unless it is dropped.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.drop() {
		return time.Now(), nil
	}
	return t.NodeAwareTransport.WriteTo(b, addr)
}

// WriteToAddress sends b unless it is dropped.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.drop() {
		return time.Now(), nil
	}
	return t.NodeAwareTransport.WriteToAddress(b, a)
}
