"""discover_node and read_token: flags win, then the state dir the node would use, then defaults."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from p2ptrain.client.discovery import (
    DEFAULT_URL,
    DiscoveryError,
    TokenUnavailable,
    discover_node,
    read_token,
)


def test_flags_win(tmp_path: Path) -> None:
    (tmp_path / "p2ptrain").mkdir()
    (tmp_path / "p2ptrain" / "api.url").write_text("http://127.0.0.1:5000\n")
    env = {"XDG_STATE_HOME": str(tmp_path)}
    url, token = discover_node("http://127.0.0.1:9999/", Path("/x/tok"), None, environ=env)
    assert (url, token) == ("http://127.0.0.1:9999", Path("/x/tok"))


def test_default_state_dir_from_xdg(tmp_path: Path) -> None:
    state = tmp_path / "p2ptrain"
    state.mkdir()
    (state / "api.url").write_text("http://127.0.0.1:5000\n")
    assert discover_node(None, None, None, environ={"XDG_STATE_HOME": str(tmp_path)}) == (
        "http://127.0.0.1:5000", state / "api.token")


def test_systemd_state_directory_beats_xdg(tmp_path: Path) -> None:
    (tmp_path / "api.url").write_text("http://127.0.0.1:6000")
    env = {"STATE_DIRECTORY": f"{tmp_path}:/other", "XDG_STATE_HOME": "/nowhere"}
    assert discover_node(None, None, None, environ=env) == ("http://127.0.0.1:6000", tmp_path / "api.token")


def test_config_state_dir_and_env_override(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d, port in ((a, 7001), (b, 7002)):
        d.mkdir()
        (d / "api.url").write_text(f"http://127.0.0.1:{port}")
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nstate_dir = "{a}"\n')
    env = {"STATE_DIRECTORY": "/nowhere"}
    assert discover_node(None, None, config, environ=env) == ("http://127.0.0.1:7001", a / "api.token")
    env["P2PTRAIN_NODE__STATE_DIR"] = str(b)
    assert discover_node(None, None, config, environ=env)[0] == "http://127.0.0.1:7002"


def test_no_url_file_falls_back_to_config_port_then_default(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path}"\n[api]\nhost = "0.0.0.0"\nport = 41999\n')
    assert discover_node(None, None, config, environ={})[0] == "http://127.0.0.1:41999"
    config.write_text(f'[node]\nstate_dir = "{tmp_path}"\n[api]\nport = 0\n')
    assert discover_node(None, None, config, environ={})[0] == DEFAULT_URL
    (tmp_path / "api.url").write_text("garbage")
    assert discover_node(None, None, None, environ={"STATE_DIRECTORY": str(tmp_path)})[0] == DEFAULT_URL


@pytest.mark.parametrize("content, error", [(None, "no such file"), ("[node\n", "not valid TOML")])
def test_bad_config_is_one_clear_error(tmp_path: Path, content: str | None, error: str) -> None:
    config = tmp_path / "node.toml"
    if content is not None:
        config.write_text(content)
    with pytest.raises(DiscoveryError, match=error):
        discover_node(None, None, config, environ={})


def test_read_token(tmp_path: Path) -> None:
    path = tmp_path / "api.token"
    with pytest.raises(TokenUnavailable, match="does not exist"):
        read_token(path)
    path.write_text("  \n")
    with pytest.raises(TokenUnavailable, match="is empty"):
        read_token(path)
    path.write_text("abc123\n")
    assert read_token(path) == "abc123"
    with pytest.raises(TokenUnavailable, match="pass --token-file"):
        read_token(None)
    with pytest.raises(TokenUnavailable, match="cannot read"):
        read_token(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file regardless of its mode")
def test_unreadable_token_says_so(tmp_path: Path) -> None:
    path = tmp_path / "api.token"
    path.write_text("abc")
    path.chmod(0)
    with pytest.raises(TokenUnavailable, match="not readable by this user"):
        read_token(path)
