"""The little HTTP the dashboard needs, on the standard library alone: a request over a WSGI environ, a response."""

from __future__ import annotations

from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import Any, Iterable, Optional
from urllib.parse import parse_qs, urlencode

#: The largest form body read; the dashboard's forms carry ids and a token, far less.
MAX_FORM_BYTES = 1_048_576
#: The environ key under which a host framework (contrib.flask, contrib.django) passes its own request.
HOST_REQUEST_KEY = "runledger.host_request"


class Request:
    """One request: method, path within the dashboard, query, form and cookies.

    Attributes:
        environ: The WSGI environ, as the server (or the host framework) gave it.
        method: ``GET``, ``POST``...
        path: The path below the dashboard's mount point, starting with ``/``.
        root: The mount point (``SCRIPT_NAME``), ``""`` at the server root.
        host_request: The host framework's own request when the dashboard is mounted
            in Flask or Django (an authorize hook reads its user there), else None.
    """

    def __init__(self, environ: dict[str, Any]) -> None:
        self.environ = environ
        self.method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        self.path = environ.get("PATH_INFO") or "/"
        self.root = str(environ.get("SCRIPT_NAME", "")).rstrip("/")
        self._query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=False)
        self.host_request = environ.get(HOST_REQUEST_KEY)
        self._form: Optional[dict[str, list[str]]] = None

    def arg(self, name: str) -> Optional[str]:
        """The first value of a query parameter, stripped; None when absent or blank."""
        values = self._query.get(name)
        value = values[0].strip() if values else ""
        return value or None

    def form(self, name: str) -> Optional[str]:
        values = self.form_list(name)
        return values[0] if values else None

    def form_list(self, name: str) -> list[str]:
        """Every value of a form field (checkboxes repeat their name)."""
        if self._form is None:
            self._form = self._read_form()
        return [value.strip() for value in self._form.get(name, []) if value.strip()]

    def _read_form(self) -> dict[str, list[str]]:
        if self.method != "POST":
            return {}
        try:
            length = int(self.environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        stream = self.environ.get("wsgi.input")
        if stream is None or length <= 0:
            return {}
        body = stream.read(min(length, MAX_FORM_BYTES))
        return parse_qs(body.decode("utf-8", errors="replace"))

    def cookie(self, name: str) -> Optional[str]:
        try:
            morsel = SimpleCookie(self.environ.get("HTTP_COOKIE", "")).get(name)
        except CookieError:
            return None
        return morsel.value if morsel is not None else None

    def url(self, path: str, **query: Any) -> str:
        """A URL within the dashboard; query values that are None are left out."""
        kept = {key: value for key, value in query.items() if value is not None}
        return self.root + path + (f"?{urlencode(kept)}" if kept else "")


@dataclass
class Response:
    """What a view returns: status, headers and a body."""

    body: bytes = b""
    status: int = HTTPStatus.OK
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def redirect(cls, location: str) -> "Response":
        # 303: the browser follows a form's POST with a GET, so a reload never repeats the action.
        return cls(status=HTTPStatus.SEE_OTHER, headers=[("Location", location)])

    def status_line(self) -> str:
        status = HTTPStatus(self.status)
        return f"{status.value} {status.phrase}"

    def all_headers(self) -> list[tuple[str, str]]:
        return [("Content-Type", self.content_type), ("Content-Length", str(len(self.body))), *self.headers]

    def wsgi(self, start_response: Any) -> Iterable[bytes]:
        start_response(self.status_line(), self.all_headers())
        return [self.body]
