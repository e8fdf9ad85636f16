"""HTTP(S) GETs that follow the address rules: every connection checked before it is made, redirects over http(s) only.

The check sits where the socket is opened (``http.client``'s connection factory), so it covers the
first request and every redirect alike, and the connection goes to the very address that was
checked (a second DNS answer cannot swap it).  Environment proxies are not used: through a proxy,
the address the rules must check is the proxy's business, not ours.  A redirect to another scheme
(``file:``, ``ftp:``) is refused rather than followed, and so is a long chain of redirects.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.parse
import urllib.request
from typing import Any

from p2ptrain.data.addresses import AddressPolicy, Refused, reached

#: Redirects followed per download at most.
MAX_REDIRECTS = 5
_SCHEMES = ("http", "https")


class Chain:
    """One download's way through redirects: what its connections have reached so far."""

    def __init__(self, policy: AddressPolicy, reach: str | None = None) -> None:
        self.policy, self.reach = policy, reach

    def create_connection(self, address: tuple[str, int], timeout: object = None,
                          source_address: tuple[str, int] | None = None) -> socket.socket:
        """``socket.create_connection`` that connects only to addresses the rules allow, checked first."""
        host, port = address
        refused: Refused | None = None
        last: OSError | None = None
        for family, kind, proto, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            try:
                target = self.policy.check(self.reach, host, str(sockaddr[0]), port)
            except Refused as exc:
                refused = refused or exc
                continue
            sock = socket.socket(family, kind, proto)
            try:
                if isinstance(timeout, int | float):  # else http.client's "the default" sentinel
                    sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            self.reach = reached(self.reach, target)
            return sock
        if last is not None:
            raise last
        raise refused or OSError(f"{host} has no address")


def open_url(url: str, *, timeout: float, chain: Chain) -> Any:
    """The response to GET ``url``, as ``urllib.request.urlopen`` gives it; :class:`Refused` when a rule says no."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in _SCHEMES:
        raise Refused(f"{url[:120]}: only http(s) URLs are read")
    opener = urllib.request.OpenerDirector()
    for handler in (_HTTP(chain), _HTTPS(chain), _Redirects(), urllib.request.HTTPDefaultErrorHandler(),
                    urllib.request.HTTPErrorProcessor(), urllib.request.UnknownHandler()):
        opener.add_handler(handler)
    return opener.open(url, timeout=timeout)


def _factory(cls: type[http.client.HTTPConnection], chain: Chain) -> Any:
    def connection(host: str, **kwargs: Any) -> http.client.HTTPConnection:
        made = cls(host, **kwargs)
        made._create_connection = chain.create_connection  # type: ignore[attr-defined]
        return made

    return connection


class _HTTP(urllib.request.HTTPHandler):
    def __init__(self, chain: Chain) -> None:
        super().__init__()
        self._chain = chain

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_factory(http.client.HTTPConnection, self._chain), req)


class _HTTPS(urllib.request.HTTPSHandler):
    def __init__(self, chain: Chain) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(context=self._tls)
        self._chain = chain

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_factory(http.client.HTTPSConnection, self._chain), req, context=self._tls)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Redirects over http(s) only, at most ``MAX_REDIRECTS``; the address rules apply when each one connects."""

    max_redirections = MAX_REDIRECTS

    def http_error_302(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any) -> Any:
        target = headers.get("location") or headers.get("uri")
        if target:
            absolute = urllib.parse.urljoin(req.full_url, target.strip())
            scheme = urllib.parse.urlsplit(absolute).scheme.lower()
            if scheme not in _SCHEMES:
                fp.close()
                raise Refused(f"redirected to a {scheme or 'scheme-less'} URL ({absolute[:120]}); only http(s) "
                              "redirects are followed")
        if len(getattr(req, "redirect_dict", {})) >= MAX_REDIRECTS:
            fp.close()
            raise Refused(f"more than {MAX_REDIRECTS} redirects")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

