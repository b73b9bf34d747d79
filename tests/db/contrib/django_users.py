"""A stand-in for Django's authentication middleware in the contrib tests: the user comes from a header.

``X-User: staff:ada`` is a logged-in staff user, ``X-User: user:bob`` a logged-in user
who is not staff; no header is the anonymous visitor. Real users would need the auth
tables; the dashboard reads only ``is_authenticated`` and ``is_staff``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable


def header_user(get_response: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def middleware(request: Any) -> Any:
        kind, _, name = request.META.get("HTTP_X_USER", "").partition(":")
        request.user = SimpleNamespace(is_authenticated=bool(name), is_staff=kind == "staff", username=name)
        return get_response(request)

    return middleware
