"""Shared tooling of the test suite: API calls to live nodes, sd_notify capture, import graphs."""
