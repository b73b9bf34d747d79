"""CSRF protection for the dashboard's actions: a double-submitted, signed token.

Each browser gets a random cookie; every form carries the HMAC of that cookie
under the app's secret. Another site can make the browser send the cookie, but
cannot read it, so it cannot compute the form value; and a value copied from one
browser's page is useless with another browser's cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Optional

from runledger_sync.core.errors import CsrfRejected
from runledger_sync.web.http import Request

COOKIE_NAME = "runledger_csrf"
FIELD_NAME = "csrf_token"
#: Cookie values are 43 URL-safe characters; anything else is not one of ours.
_COOKIE_BYTES = 32


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

    def browser_token(self, request: Request) -> tuple[str, bool]:
        """This browser's cookie value, and whether it is new (and must be set on the response)."""
        existing = request.cookie(COOKIE_NAME)
        if existing is not None and len(existing) == 43:
            return existing, False
        return secrets.token_urlsafe(_COOKIE_BYTES), True

    def form_token(self, browser_token: str) -> str:
        return hmac.new(self._secret, browser_token.encode("ascii", "replace"), hashlib.sha256).hexdigest()

    def check(self, request: Request) -> None:
        """Raise CsrfRejected unless the form's token signs this browser's cookie."""
        cookie = request.cookie(COOKIE_NAME)
        sent = request.form(FIELD_NAME)
        if not cookie or not sent or not hmac.compare_digest(sent, self.form_token(cookie)):
            raise CsrfRejected()

    @staticmethod
    def cookie_header(browser_token: str, path: str, *, secure: bool) -> tuple[str, str]:
        # HttpOnly: page scripts never need it (the form carries the signed copy).
        # SameSite=Strict: other sites' requests do not even carry it.
        # Secure when the page came over HTTPS, so the cookie never travels in clear.
        flags = "; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")
        return ("Set-Cookie", f"{COOKIE_NAME}={browser_token}; Path={path or '/'}{flags}")
