package health

import (
	"context"
	"fmt"
	"math"
	"syscall"
	"time"
)

func init() {
	RegisterProbe(ProbeKind{Name: "etcdDisk", Interval: 10 * time.Second, Section: func() ProbeSection { return &DiskSection{} },
		Help: "free space on etcd's filesystem (`dataDir`, default " + DefaultEtcdDataDir + "): below `minFreeBytes` (2 GiB) or `minFreePercent` (10)"})
}

// DiskSection is probes.etcdDisk.
type DiskSection struct {
	ProbeSettings
	// DataDir is a path on etcd's filesystem (default /var/lib/etcd); only its free space is read.
	DataDir string `json:"dataDir"`
	// MinFreeBytes: the probe fails below this much free space (default 2 GiB).
	MinFreeBytes uint64 `json:"minFreeBytes"`
	// MinFreePercent: the probe fails below this share of the filesystem free (default 10).
	MinFreePercent float64 `json:"minFreePercent"`
}

// New makes the disk probe.
func (s *DiskSection) New(ProbeEnv) (Probe, error) {
	return NewDiskProbe(s.DataDir, s.MinFreeBytes, s.MinFreePercent)
}

// Paths is its data directory.
func (s *DiskSection) Paths() []*string { return []*string{&s.DataDir} }

// Validate checks minFreePercent.
func (s *DiskSection) Validate() error {
	if pct := s.MinFreePercent; pct < 0 || pct >= 100 || math.IsNaN(pct) {
		return fmt.Errorf("minFreePercent %v: want a percentage from 0 to below 100", pct)
	}
	return nil
}

// DefaultEtcdDataDir is where kubeadm keeps etcd's data.
const DefaultEtcdDataDir = "/var/lib/etcd"

// diskProbe fails when the filesystem holding dir has less than minFree bytes or minPercent percent
// free: etcd stops accepting writes (NOSPACE) long before the disk is full, and compaction needs room.
type diskProbe struct {
	dir        string
	minFree    uint64
	minPercent float64
}

// NewDiskProbe watches the free space of dir (default /var/lib/etcd): failing below minFreeBytes
// (default 2 GiB) or minPercent (default 10 %).
func NewDiskProbe(dir string, minFreeBytes uint64, minPercent float64) (Probe, error) {
	if dir == "" {
		dir = DefaultEtcdDataDir
	}
	if minFreeBytes == 0 {
		minFreeBytes = 2 << 30
	}
	if minPercent == 0 {
		minPercent = 10
	}
	if minPercent < 0 || minPercent > 100 {
		return nil, fmt.Errorf("probe etcdDisk: minFreePercent %v: want 0 to 100", minPercent)
	}
	return &diskProbe{dir: dir, minFree: minFreeBytes, minPercent: minPercent}, nil
}

func (p *diskProbe) Name() string { return "etcdDisk" }

func (p *diskProbe) Check(context.Context) (bool, string) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(p.dir, &st); err != nil {
		return false, fmt.Sprintf("statfs %s: %v", p.dir, err)
	}
	free := st.Bavail * uint64(st.Bsize)
	total := st.Blocks * uint64(st.Bsize)
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(free) / float64(total)
	}
	detail := fmt.Sprintf("%s: %s free of %s (%.1f%%)", p.dir, bytesHuman(free), bytesHuman(total), pct)
	if free < p.minFree || pct < p.minPercent {
		return false, fmt.Sprintf("%s; want at least %s and %.0f%%", detail, bytesHuman(p.minFree), p.minPercent)
	}
	return true, detail
}

func bytesHuman(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}
