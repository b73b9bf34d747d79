"""CSRF protection for the dashboard's actions: the request's origin, then a token bound to session and user.

Two checks on every POST:

- **Origin.** A browser names the page a form was posted from (``Origin``, and
  ``Sec-Fetch-Site`` in current browsers); it must be the dashboard's own scheme,
  host and port, and a POST that names neither is refused. Another port of the same host is another origin, though it is the
  same *site* for cookies, so a cookie planted from there does not help it.
- **Token.** Every form carries ``HMAC(key, session value, user)``: the session
  value is a random secret kept in the host framework's session (Flask's
  ``session``) or else in a cookie of the dashboard's own, and the user is the id
  the authorize hook answered. A token read by one user is refused for another,
  even when that user's browser was made to carry the same cookie.

Mounted in Django, Django's own CSRF protection checks the form instead.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Optional
from urllib.parse import urlsplit

from runledger_sync.core.dashboard_errors import CrossOriginRejected, CsrfRejected, OriginMissing
from runledger_sync.web.http import Request

COOKIE_NAME = "runledger_csrf"
FIELD_NAME = "csrf_token"
#: Cookie and session values are 43 URL-safe characters; anything else is not one of ours.
_VALUE_BYTES = 32
_VALUE_LENGTH = 43
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def new_session_value() -> str:
    """A fresh random value for a host session to keep (see :class:`CsrfGuard`)."""
    return secrets.token_urlsafe(_VALUE_BYTES)


def _origin_of(scheme: str, netloc: str) -> Optional[tuple[str, str, str]]:
    """(scheme, host, port) with the scheme's default port filled in; None when it does not parse."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return scheme.lower(), parts.hostname.lower(), str(port) if port is not None else _DEFAULT_PORTS.get(scheme, "")


def own_origin(request: Request) -> Optional[tuple[str, str, str]]:
    """The origin this request was addressed to: its scheme and Host header (after any proxy fix-up)."""
    environ = request.environ
    scheme = str(environ.get("wsgi.url_scheme") or "http")
    host = environ.get("HTTP_HOST") or f"{environ.get('SERVER_NAME', '')}:{environ.get('SERVER_PORT', '')}"
    return _origin_of(scheme, str(host))


def check_origin(request: Request) -> None:
    """Raise CrossOriginRejected when the browser says the form came from another origin, OriginMissing when it says nothing.

    Every current browser sends ``Origin`` with a POST; a request with neither header
    cannot show that it was posted from this dashboard, so it is refused (a script
    that posts an action sends the dashboard's own ``Origin``).
    """
    fetch_site = request.header("Sec-Fetch-Site")
    origin = request.header("Origin")
    if fetch_site is None and origin is None:
        raise OriginMissing("the form was posted without an Origin header; browsers send it, a script must "
                            "send the dashboard's own origin (e.g. Origin: http://localhost:8080)")
    if fetch_site is not None and fetch_site.lower() != "same-origin":
        raise CrossOriginRejected(f"the form was posted from a {fetch_site} page, not from this dashboard")
    if origin is None:
        return
    parts = urlsplit(origin)
    claimed = _origin_of(parts.scheme, parts.netloc) if parts.scheme in _DEFAULT_PORTS else None
    expected = own_origin(request)
    if claimed is None or expected is None or claimed != expected:
        # The value is the browser's, not the user's input: short and worth logging, but not echoed whole.
        raise CrossOriginRejected(f"the form was posted from origin {origin[:100]!r}, not from this dashboard")


class CsrfGuard:
    """Issues form tokens and checks them on POST.

    Args:
        secret: What the HMAC key is derived from. Give the same one to every process
            serving the dashboard (a host app's own secret key is fine: the key is
            derived for this use alone); a new random one is made when None (tokens
            then live as long as the process).
    """

    def __init__(self, secret: Optional[bytes] = None) -> None:
        seed = secret if secret is not None else secrets.token_bytes(32)
        self._secret = hmac.new(seed, b"runledger dashboard csrf", hashlib.sha256).digest()

    def session_value(self, request: Request) -> tuple[str, bool]:
        """The value this browser's tokens are bound to, and whether it is a new cookie to set on the response."""
        if request.session_value is not None:
            return request.session_value, False
        existing = request.cookie(COOKIE_NAME)
        if existing is not None and len(existing) == _VALUE_LENGTH:
            return existing, False
        return new_session_value(), True

    def form_token(self, session_value: str, user: str) -> str:
        # Each part is length-prefixed, so no (session, user) pair can be made to sign like another.
        message = b"".join(len(part).to_bytes(4, "big") + part
                           for part in (session_value.encode("utf-8", "replace"), user.encode("utf-8", "replace")))
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def check(self, request: Request) -> None:
        """Raise CsrfRejected unless the form's token signs this browser's session value and this request's user."""
        value = request.session_value if request.session_value is not None else request.cookie(COOKIE_NAME)
        sent = request.form(FIELD_NAME)
        if not value or not sent or not hmac.compare_digest(sent, self.form_token(value, request.user)):
            raise CsrfRejected()

    @staticmethod
    def cookie_header(session_value: str, path: str, *, secure: bool) -> tuple[str, str]:
        # HttpOnly: page scripts never need it (the form carries the signed copy).
        # SameSite=Strict: other sites' requests do not even carry it.
        # Secure when the page came over HTTPS, so the cookie never travels in clear.
        flags = "; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")
        return ("Set-Cookie", f"{COOKIE_NAME}={session_value}; Path={path or '/'}{flags}")
