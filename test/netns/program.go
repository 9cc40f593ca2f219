package netns

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// Program is what a lab needs of a test (TB), for a program that is not one (the chaos harness,
// test/kubecluster): Logf and Errorf write to Log, Fatalf ends what Run runs, and Close runs the
// cleanups, last first.
type Program struct {
	Dir string // where TempDir makes its directories
	Log io.Writer

	mu       sync.Mutex
	cleanups []func()
}

// programFatal is the panic Fatalf raises, and Run recovers.
type programFatal struct{ msg string }

// Run runs f and returns what a Fatalf in it said, as an error.
func (p *Program) Run(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			pf, ok := r.(programFatal)
			if !ok {
				panic(r)
			}
			err = errors.New(pf.msg)
		}
	}()
	f()
	return nil
}

func (p *Program) Helper() {}

// Failed is false: a program's outcome is what Run returns.
func (p *Program) Failed() bool { return false }

func (p *Program) Logf(format string, args ...any) { fmt.Fprintf(p.Log, format+"\n", args...) }

// Errorf logs: a lab reports its cleanup's failures with it, and the next lab removes what is left.
func (p *Program) Errorf(format string, args ...any) { p.Logf("error: "+format, args...) }

func (p *Program) Fatalf(format string, args ...any) {
	panic(programFatal{fmt.Sprintf(format, args...)})
}

func (p *Program) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}

func (p *Program) TempDir() string {
	d, err := os.MkdirTemp(p.Dir, "tmp")
	if err != nil {
		p.Fatalf("%v", err)
	}
	return d
}

// Close runs the cleanups, last first.
func (p *Program) Close() {
	p.mu.Lock()
	cs := p.cleanups
	p.cleanups = nil
	p.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}
