"""The import graph keeps its direction: the service never depends on the monitor, the library on neither."""

from __future__ import annotations

from tests.support.imports import REPO, project_imports, source_files


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
    # cli.py is the front door: it names daemon and tui commands as strings, imported on use.
    assert _offenders("p2ptrain", ("p2ptrain.daemon", "p2ptrain.tui"), exempt=("p2ptrain/cli.py",)) == {}


def test_the_graph_reader_sees_imports() -> None:
    """The checks above would pass vacuously if the reader found nothing."""
    assert "p2ptrain.nodeclient" in project_imports(REPO / "daemon" / "nodectl.py")
    assert "p2ptrain.tui.widgets.node" in project_imports(REPO / "tui" / "app.py")
    assert "p2ptrain.daemon.api" in project_imports(REPO / "daemon" / "service.py")
