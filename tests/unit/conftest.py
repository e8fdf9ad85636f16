"""Fixtures of the unit tests (the monitoring ones live in ``monitoring_fixtures``)."""

from __future__ import annotations

from monitoring_fixtures import populated_latest, promtool  # noqa: F401 - re-exported as fixtures
