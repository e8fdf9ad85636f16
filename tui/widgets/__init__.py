"""Widgets of the p2ptrain top monitor; they never do I/O."""
