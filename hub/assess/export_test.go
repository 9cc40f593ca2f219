package assess

// What the tests (package assess_test) read of an assessor's insides.

// Epochs counts the members whose evidence counts from a (re)start or change of cluster.
func Epochs(a *Assessor) int { return len(a.epochs) }

// EpochOf says why member's epoch began, and each observer's report version then.
func EpochOf(a *Assessor, member string) (string, map[string]uint64) {
	e := a.epochs[member]
	return e.why, e.versions
}

// RejoinSettle is rejoinSettle.
const RejoinSettle = rejoinSettle
