"""Side-by-side performance harness (not part of the test suite)."""
