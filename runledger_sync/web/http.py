"""The little HTTP the dashboard needs, on the standard library alone: a request over a WSGI environ, a response."""

from __future__ import annotations

from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import Any, Iterable, Optional, Protocol
from urllib.parse import parse_qs, urlencode, urlsplit

from runledger_sync.core.dashboard_errors import IncompleteRequestBody

#: The largest form body read; the dashboard's forms carry ids and a token, far less.
MAX_FORM_BYTES = 1_048_576
#: Sent with every response, pages, redirects, errors and the stylesheet alike; a page
#: replaces the Content-Security-Policy with its own (which allows its script nonce).
SECURITY_HEADERS = (
    ("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
)


@dataclass(frozen=True)
class HostForm:
    """A form the host framework has checked against its own CSRF protection (Django's).

    Attributes:
        field: The hidden field the host reads its token from (``csrfmiddlewaretoken``).
        token: The value to draw in it for this request.
    """

    field: str
    token: str


class Request:
    """One request: method, path within the dashboard, query, form and cookies.

    Attributes:
        environ: The WSGI environ, as the server (or the host framework) gave it.
        method: ``GET``, ``POST``...
        path: The path below the dashboard's mount point, starting with ``/``.
        root: The mount point (``SCRIPT_NAME``), ``""`` at the server root.
        host_request: The host framework's own request when the dashboard is mounted
            in Flask or Django; the authorize hook is then given that request.
        session_value: A secret, random value the host keeps in this user's session
            (Flask's ``session``); the CSRF token is bound to it instead of a cookie
            of the dashboard's own.
        host_form: Set when the host framework checks the form itself (Django's CSRF).
        user: What the authorize hook answered for this request: the user's id when
            it returned one, else ``""``; the CSRF token is bound to it.
    """

    def __init__(self, environ: dict[str, Any], *, host_request: Any = None, session_value: Optional[str] = None,
                 host_form: Optional[HostForm] = None) -> None:
        self.environ = environ
        self.method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        self.path = environ.get("PATH_INFO") or "/"
        self.root = str(environ.get("SCRIPT_NAME", "")).rstrip("/")
        self._query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=False)
        self.host_request = host_request
        self.session_value = session_value
        self.host_form = host_form
        self.user = ""
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
        wanted = min(length, MAX_FORM_BYTES)
        try:
            # A client that sends less than its Content-Length leaves this read waiting
            # until the server's socket timeout ends it.
            body = stream.read(wanted)
        except OSError as error:
            raise IncompleteRequestBody() from error
        if len(body) < wanted:
            raise IncompleteRequestBody()
        return parse_qs(body.decode("utf-8", errors="replace"))

    def cookie(self, name: str) -> Optional[str]:
        try:
            morsel = SimpleCookie(self.environ.get("HTTP_COOKIE", "")).get(name)
        except CookieError:
            return None
        return morsel.value if morsel is not None else None

    def host_name(self) -> Optional[str]:
        """The host name the client addressed (the Host header without its port), lowercased; None without one."""
        host = self.environ.get("HTTP_HOST")
        if not host:
            return None
        try:
            return urlsplit(f"//{host}").hostname
        except ValueError:
            return ""

    def header(self, name: str) -> Optional[str]:
        """A request header by its HTTP name (``Origin``), or None."""
        return self.environ.get("HTTP_" + name.upper().replace("-", "_"))

    def url(self, path: str, **query: Any) -> str:
        """A URL within the dashboard; query values that are None are left out."""
        kept = {key: value for key, value in query.items() if value is not None}
        return self.root + path + (f"?{urlencode(kept)}" if kept else "")


@dataclass
class Response:
    """What a view returns: status, headers and a body.

    ``error_code`` names the refusal or error an error page shows (a host framework
    mount reads it, e.g. to send an anonymous visitor to its login page).
    """

    body: bytes = b""
    status: int = HTTPStatus.OK
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    error_code: Optional[str] = None

    @classmethod
    def redirect(cls, location: str) -> "Response":
        # 303: the browser follows a form's POST with a GET, so a reload never repeats the action.
        return cls(status=HTTPStatus.SEE_OTHER, headers=[("Location", location)])

    def status_line(self) -> str:
        status = HTTPStatus(self.status)
        return f"{status.value} {status.phrase}"

    def all_headers(self) -> list[tuple[str, str]]:
        """Every header to send: the body's, the view's, then each security header the view did not set."""
        named = {name.lower() for name, _ in self.headers}
        defaults = [(name, value) for name, value in SECURITY_HEADERS if name.lower() not in named]
        return [("Content-Type", self.content_type), ("Content-Length", str(len(self.body))), *self.headers, *defaults]

    def wsgi(self, start_response: Any) -> Iterable[bytes]:
        start_response(self.status_line(), self.all_headers())
        return [self.body]


class PageHost(Protocol):
    """What a view needs of the dashboard serving it (:class:`runledger_sync.web.app.Dashboard`):
    named here so the views, which the dashboard's routes call, need not import it back."""

    engine: Any

    def organization(self, request: Request) -> Optional[str]: ...

    def require_action(self, request: Request, action: str) -> None: ...

    def render(self, request: Request, template: str, status: int = ..., **context: Any) -> Response: ...
