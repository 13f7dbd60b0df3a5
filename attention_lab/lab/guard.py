"""The lab answers its own page only: every request is checked here before any route runs, so a refused one costs
no model work (docs/lab.md, "What the checks stop and what they do not").

    Host          one of the loopback names (localhost, 127.0.0.1, [::1]) or the --host given, with the port the
                  server listens on; else 421. A foreign page whose name resolves to 127.0.0.1 (DNS rebinding)
                  sends its own name as Host, so it reaches nothing.
    Origin        when the browser sends one: http://<the Host> (the page the lab served); else 403. A page of
                  another site (another origin) cannot have the lab compute for it.
    Content-Type  a request with a body (POST) is application/json; else 415. A cross-site form or a no-cors
                  fetch can only send text/plain, form-urlencoded or multipart, so none reaches the model.

Starlette's TrustedHostMiddleware checks the name alone (it drops the port and cuts "[::1]:8008" at its first
colon), so this is a small pure ASGI middleware of its own, like Jupyter's and Vite's checks. Lifespan messages
pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")  # no body, no work beyond reading what is served


def host_name(host: str) -> str:
    """An address as a Host header writes it: lower case, an IPv6 address in brackets ("::1" -> "[::1]")."""
    host = host.strip().lower()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header's (name, port or None), or None when it is not one ("a:b:c", "[::1", "x:8o")."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if not name:
        return None
    if not rest:
        return name, None
    digits = rest[1:]
    if not (rest.startswith(":") and digits.isascii() and digits.isdigit() and len(digits) <= 5):
        return None
    return name, int(digits)


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


class Guard:
    """ASGI middleware: Host, Origin and Content-Type checked (module docstring). hosts: the names besides the
    loopback ones (the --host given); counts: an object whose `open` (requests let through and not yet answered)
    and `refused` it keeps (the app's Worker: the tests and the load benchmark read them)."""

    def __init__(self, app, hosts: Iterable[str] = (), counts=None):
        self.app = app
        self.names = frozenset(LOOPBACK_NAMES) | {host_name(h) for h in hosts if h}
        self.counts = counts if counts is not None else type("Counts", (), {"open": 0, "refused": 0})()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.check(scope)
        if refusal is None:
            self.counts.open += 1
            try:
                await self.app(scope, receive, send)
            finally:
                self.counts.open -= 1
            return
        self.counts.refused += 1
        status, message = refusal
        body = json.dumps({"error": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    def check(self, scope) -> tuple[int, str] | None:
        """None for a request of the lab's own page, else (status, message)."""
        headers = {}
        for k, v in scope.get("headers", ()):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        host = headers.get("host", "")
        parsed = split_host(host)
        server = scope.get("server")
        port = server[1] if server and len(server) > 1 and server[1] is not None else None
        default = 443 if scope.get("scheme") == "https" else 80
        if parsed is None or parsed[0] not in self.names or (
                port is not None and (parsed[1] if parsed[1] is not None else default) != port):
            allowed = ", ".join(sorted(self.names))
            return 421, (f"Host {_short(host)} is not this lab's: it answers its own names only ({allowed}, port "
                         f"{port}); open the URL it printed (a page of another name is refused, docs/lab.md)")
        origin = headers.get("origin")
        if origin is not None and origin.strip().lower() != f"{scope.get('scheme', 'http')}://{host.strip().lower()}":
            return 403, (f"Origin {_short(origin)} is not this lab's page: only the page the lab serves may use it "
                         "(docs/lab.md)")
        if scope.get("method", "GET") not in SAFE_METHODS:
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                return 415, (f"a {scope.get('method')} must send Content-Type: application/json, got "
                             f"{_short(headers.get('content-type', '(none)'))}")
        return None
