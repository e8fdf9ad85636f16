"""Find the local node's API URL and token file: flags first, then the config's state dir, then defaults.

Used by ``p2ptrain top`` and ``p2ptrain pause/resume/leave``.  Standard library only: it reads the
config file and its ``P2PTRAIN_*`` overrides through :mod:`p2ptrain.config.tomlfile` (as the node does,
without pydantic) and resolves the state directory by the node's own rules (:mod:`p2ptrain.paths`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from p2ptrain.config.tomlfile import env_overrides, read_toml, with_overrides
from p2ptrain.errors import ConfigError
from p2ptrain.paths import resolve_state_dir

DEFAULT_URL = "http://127.0.0.1:41480"
URL_FILE = "api.url"
TOKEN_FILE = "api.token"
#: The settings discovery reads that hold text (an override keeps its text even if it reads as a number).
_TEXT_SETTINGS = frozenset({("node", "state_dir"), ("api", "host")})


class DiscoveryError(Exception):
    """A config file that was asked for cannot be read; the message is one line for humans."""


class TokenUnavailable(Exception):
    """The control token cannot be read; the message says which file and why."""


def _settings(config: Path | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """The config file (or nothing) with the node's env overrides on top, as the node reads them."""
    try:
        data = read_toml(config) if config is not None else {}
        return with_overrides(data, env_overrides(environ, lambda s, k: (s, k) in _TEXT_SETTINGS))
    except ConfigError as error:
        raise DiscoveryError(str(error)) from None


def _setting(data: dict[str, Any], section: str, key: str) -> Any:
    values = data.get(section)
    return values.get(key) if isinstance(values, dict) else None


def state_dir(configured: Any, environ: Mapping[str, str]) -> Path | None:
    """The node's state directory by the node's own rules; None when there is no home to fall back on."""
    try:
        return resolve_state_dir(configured if isinstance(configured, str) else None, environ)
    except RuntimeError:  # no HOME and no passwd entry
        return None


def _url_from_config(data: dict[str, Any]) -> str | None:
    host, port = _setting(data, "api", "host"), _setting(data, "api", "port")
    if port is None:
        return None
    try:
        port = int(port)
    except (TypeError, ValueError):
        return None
    if port == 0:  # "pick a free one": only api.url knows which
        return None
    host = host if isinstance(host, str) and host else "127.0.0.1"
    # A wildcard bind is reached over loopback, as the node itself writes into api.url.
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def discover_node(url: str | None, token_file: Path | None, config: Path | None,
                  *, environ: Mapping[str, str] | None = None) -> tuple[str, Path | None]:
    """``(api_url, token_path)``.  The token path may not exist yet (a node that is still starting);
    it is None only when no state directory can be resolved and no ``token_file`` was given."""
    environ = os.environ if environ is None else environ
    data = _settings(config, environ)
    directory = state_dir(_setting(data, "node", "state_dir"), environ)
    if token_file is None and directory is not None:
        token_file = directory / TOKEN_FILE
    if url:
        return url.rstrip("/"), token_file
    if directory is not None:
        try:
            written = (directory / URL_FILE).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            written = ""
        if written.startswith(("http://", "https://")):
            return written.rstrip("/"), token_file
    return _url_from_config(data) or DEFAULT_URL, token_file


def read_token(path: Path | None) -> str:
    """The bearer token in ``path`` (whitespace stripped), or :class:`TokenUnavailable` saying why not."""
    if path is None:
        raise TokenUnavailable("no token file known (pass --token-file)")
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise TokenUnavailable(f"token file {path} does not exist (is the node running?)") from None
    except PermissionError:
        raise TokenUnavailable(f"token file {path} is not readable by this user (try sudo, or "
                               f"--token-file)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenUnavailable(f"token file {path}: cannot read ({exc.__class__.__name__})") from None
    if not token:
        raise TokenUnavailable(f"token file {path} is empty")
    return token
