package rules

// SetLineSearchBudget sets the bytes the search for a YAML error's line may
// parse, until the returned func restores it.
func SetLineSearchBudget(n int) (restore func()) {
	old := maxLineSearchBytes
	maxLineSearchBytes = n
	return func() { maxLineSearchBytes = old }
}
