"""Find the local node's API URL and token file: flags first, then the config's state dir, then defaults.

Reads the config TOML directly (``node.state_dir``, ``api.host``/``api.port`` and their
``P2PTRAIN_*`` env overrides) instead of importing :mod:`p2ptrain.config`, so ``p2ptrain top``
starts without pydantic.  The state-dir rules are the node's own (``p2ptrain.paths``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from p2ptrain.paths import resolve_state_dir

DEFAULT_URL = "http://127.0.0.1:41480"
URL_FILE = "api.url"
TOKEN_FILE = "api.token"


class DiscoveryError(Exception):
    """A config file that was asked for cannot be read; the message is one line for humans."""


class TokenUnavailable(Exception):
    """The control token cannot be read; the message says which file and why."""


def _read_config(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DiscoveryError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DiscoveryError(f"{path}: is a directory, expected a TOML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DiscoveryError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise DiscoveryError(f"{path}: not valid TOML: {exc}") from None


def _setting(data: dict[str, Any], section: str, key: str, environ: Mapping[str, str]) -> Any:
    """``[section] key`` with the node's env override (``P2PTRAIN_SECTION__KEY``) on top."""
    env = environ.get(f"P2PTRAIN_{section.upper()}__{key.upper()}")
    if env:
        return env
    values = data.get(section)
    return values.get(key) if isinstance(values, dict) else None


def state_dir(configured: Any, environ: Mapping[str, str]) -> Path | None:
    """The node's state directory by the node's own rules; None when there is no home to fall back on."""
    try:
        return resolve_state_dir(configured if isinstance(configured, str) else None, environ)
    except RuntimeError:  # no HOME and no passwd entry
        return None


def _url_from_config(data: dict[str, Any], environ: Mapping[str, str]) -> str | None:
    host, port = _setting(data, "api", "host", environ), _setting(data, "api", "port", environ)
    if port is None:
        return None
    try:
        port = int(port)
    except (TypeError, ValueError):
        return None
    if port == 0:  # "pick a free one": only api.url knows which
        return None
    host = host if isinstance(host, str) and host else "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def discover_node(url: str | None, token_file: Path | None, config: Path | None,
                  *, environ: Mapping[str, str] | None = None) -> tuple[str, Path | None]:
    """``(api_url, token_path)``.  The token path may not exist yet (a node that is still starting);
    it is None only when no state directory can be resolved and no ``token_file`` was given."""
    environ = os.environ if environ is None else environ
    data = _read_config(config) if config is not None else {}
    directory = state_dir(_setting(data, "node", "state_dir", environ), environ)
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
    return _url_from_config(data, environ) or DEFAULT_URL, token_file


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
