"""The import graph keeps its direction: the service never depends on the monitor, the library on neither;
and the tests reach a node's API through the project's one client."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.imports import REPO, project_imports, source_files

HTTP_CLIENTS = ("urllib.request", "http.client", "requests", "httpx", "aiohttp")
#: Tests that speak HTTP to something other than a node's API, and to what.
OTHER_SERVERS = {"tests/integration/test_prometheus_live.py": "a Prometheus server"}


def _offenders(package: str, forbidden: tuple[str, ...], exempt: tuple[str, ...] = ()) -> dict[str, list[str]]:
    found = {}
    for path in source_files(package):
        if path.relative_to(REPO).as_posix() in exempt:
            continue
        bad = sorted(name for name in project_imports(path) if name.startswith(forbidden))
        if bad:
            found[path.relative_to(REPO).as_posix()] = bad
    return found


def test_daemon_never_imports_the_tui() -> None:
    assert _offenders("p2ptrain.daemon", ("p2ptrain.tui",)) == {}


def test_library_imports_neither_daemon_nor_tui() -> None:
    # cli/ is the front door: it imports daemon and tui commands on use.
    front_door = tuple(path.relative_to(REPO).as_posix() for path in (REPO / "p2ptrain" / "cli").glob("*.py"))
    assert _offenders("p2ptrain", ("p2ptrain.daemon", "p2ptrain.tui"), exempt=front_door) == {}


def test_the_graph_reader_sees_imports() -> None:
    """The checks above would pass vacuously if the reader found nothing."""
    assert "p2ptrain.client.http" in project_imports(REPO / "daemon" / "nodectl.py")
    assert "p2ptrain.tui.widgets.node" in project_imports(REPO / "tui" / "app.py")
    assert "p2ptrain.daemon.api" in project_imports(REPO / "daemon" / "service.py")


def _absolute_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _http_clients_in_tests() -> dict[str, list[str]]:
    found = {}
    for path in sorted((REPO / "tests").rglob("*.py")):
        bad = sorted(name for name in _absolute_imports(path) if name.startswith(HTTP_CLIENTS))
        if bad:
            found[path.relative_to(REPO).as_posix()] = bad
    return found


def test_tests_reach_a_node_s_api_only_through_the_project_s_client() -> None:
    """``p2ptrain.client.http`` (or ``tests/support/nodeapi`` on top of it) is what the TUI and the
    CLI use; a test with an HTTP client of its own tests a twin.  Raw sockets stay for tests of the
    protocol itself."""
    found = _http_clients_in_tests()
    assert {name: bad for name, bad in found.items() if name not in OTHER_SERVERS} == {}
    assert sorted(set(OTHER_SERVERS) - set(found)) == []  # an exemption no longer needed goes
