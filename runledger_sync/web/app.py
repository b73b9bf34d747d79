"""The dashboard's WSGI application: routing, rendering, the read-only switch and the authorize hook.

Views live in ``views_*.py``; each is a function ``(dashboard, request, **url_parts)
-> Response`` listed in :data:`ROUTES`. A POST route names its action in the URL
(the ``action`` part), which is what the authorize hook is asked about. Every page is plain HTML from autoescaping
Jinja2 templates, usable without JavaScript.
"""

from __future__ import annotations

import io
import re
import secrets
from datetime import datetime, timezone
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import jinja2

import runledger_sync as rl
from runledger_sync.core.errors import ActionForbidden, DashboardReadOnly, DashboardRefusal
from runledger_sync.logging import get_logger
from runledger_sync.web import views_jobs, views_operations, views_overview, views_workflows
from runledger_sync.web.csrf import FIELD_NAME, CsrfGuard
from runledger_sync.web.http import HOST_REQUEST_KEY, Request, Response

PACKAGE_DIR = Path(__file__).resolve().parent
log = get_logger(__name__)

Authorize = Callable[[Request, str], bool]
OrganizationScope = Union[str, Callable[[Request], Optional[str]], None]

ROUTES: list[tuple[str, re.Pattern[str], Callable[..., Response]]] = [
    ("GET", re.compile(r"/"), views_overview.overview),
    ("GET", re.compile(r"/jobs"), views_jobs.jobs_list),
    ("GET", re.compile(r"/jobs/(?P<job_id>[0-9a-fA-F-]{32,36})"), views_jobs.job_page),
    ("POST", re.compile(r"/jobs/(?P<job_id>[0-9a-fA-F-]{32,36})/(?P<action>cancel|retry)"), views_jobs.job_action),
    ("GET", re.compile(r"/dead-letters"), views_operations.dead_letters),
    ("POST", re.compile(r"/dead-letters/(?P<action>replay)"), views_operations.replay),
    ("GET", re.compile(r"/schedules"), views_operations.schedules),
    ("POST", re.compile(r"/schedules/(?P<action>pause|resume|trigger)"), views_operations.schedule_action),
    ("GET", re.compile(r"/workflows"), views_workflows.workflows),
]

_STATUS_OF_CODE = {
    "job.not_found": HTTPStatus.NOT_FOUND,
    "schedule.not_found": HTTPStatus.NOT_FOUND,
    "workflow.run_not_found": HTTPStatus.NOT_FOUND,
    "job.invalid_state_transition": HTTPStatus.CONFLICT,
}
_STATUS_OF_CATEGORY = {"validation": HTTPStatus.BAD_REQUEST, "forbidden": HTTPStatus.FORBIDDEN,
                       "conflict": HTTPStatus.CONFLICT}


def _when(moment: Optional[datetime]) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class Dashboard:
    """The WSGI app returned by :func:`create_app`; call it as any WSGI application."""

    def __init__(self, engine: Any, *, read_only: bool, authorize: Optional[Authorize],
                 organization_id: OrganizationScope, secret: Optional[bytes]) -> None:
        self.engine = engine
        self.read_only = read_only
        self._authorize = authorize
        self._organization = organization_id
        self.csrf = CsrfGuard(secret)
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(PACKAGE_DIR / "templates")),
            autoescape=True,  # every page shows user data: job types, payloads, error messages
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["when"] = _when

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        return self.respond(Request(environ)).wsgi(start_response)

    def mounted(self, environ: dict[str, Any], prefix: str, rest: str, form: bytes, host_request: Any) -> Response:
        """Answer a request a host framework routed here: ``prefix`` is the mount point, ``rest`` the path below it.

        The host has parsed the form already (its own CSRF middleware may have), so it passes the
        form in, urlencoded.
        """
        environ = {
            **environ, "SCRIPT_NAME": prefix.rstrip("/"), "PATH_INFO": "/" + rest.lstrip("/"),
            "wsgi.input": io.BytesIO(form), "CONTENT_LENGTH": str(len(form)), HOST_REQUEST_KEY: host_request,
        }
        return self.respond(Request(environ))

    def respond(self, request: Request) -> Response:
        if request.method == "GET" and request.path == "/static/style.css":
            return Response((PACKAGE_DIR / "static" / "style.css").read_bytes(), content_type="text/css; charset=utf-8")
        view, parts, allowed = self._route(request)
        if view is None:
            if allowed:
                response = self.error_page(request, HTTPStatus.METHOD_NOT_ALLOWED, "web.method_not_allowed",
                                           f"{request.method} is not served at {request.path}")
                response.headers.append(("Allow", ", ".join(allowed)))
                return response
            return self.error_page(request, HTTPStatus.NOT_FOUND, "web.not_found", f"no page at {request.path}")
        try:
            if request.method == "POST":
                self._check_action(request, parts["action"])
            else:
                self.require(request, "view")
            response = view(self, request, **parts)
        except rl.RunledgerError as error:
            status = _STATUS_OF_CODE.get(error.code) or _STATUS_OF_CATEGORY.get(error.category, HTTPStatus.INTERNAL_SERVER_ERROR)
            if request.method == "POST":
                log.info("dashboard action refused", extra={"action": parts["action"], "path": request.path,
                                                            "error_code": error.code})
            return self.error_page(request, status, error.code, error.message, refused=isinstance(error, DashboardRefusal))
        if request.method == "POST":
            log.info("dashboard action", extra={"action": parts["action"], "path": request.path})
        return response

    def _route(self, request: Request) -> tuple[Optional[Callable[..., Response]], dict[str, str], list[str]]:
        """The view and URL parts of the request; else None and the methods the path allows (none: no such page)."""
        allowed = []
        for method, pattern, view in ROUTES:
            match = pattern.fullmatch(request.path.rstrip("/") or "/")
            if match is None:
                continue
            if method == request.method:
                return view, match.groupdict(), [method]
            allowed.append(method)
        return None, {}, allowed

    def _check_action(self, request: Request, action: str) -> None:
        # Read-only first: such an app refuses every POST whatever the token says.
        if self.read_only:
            raise DashboardReadOnly()
        self.csrf.check(request)
        self.require(request, action)

    def require(self, request: Request, action: str) -> None:
        """Raise ActionForbidden unless the authorize hook allows ``action`` (no hook: reads only)."""
        if self._authorize is None:
            if action == "view":
                return
            raise ActionForbidden("actions need an authorize hook: create_app(engine, read_only=False, authorize=...)")
        if not self._authorize(request, action):
            raise ActionForbidden(f"the authorize hook refused {action!r}", action=action)

    def organization(self, request: Request) -> Optional[str]:
        """The organization this request is scoped to, or None for every organization."""
        if callable(self._organization):
            return self._organization(request)
        return self._organization

    def can(self, request: Request, action: str) -> bool:
        """Whether to show the buttons of ``action``: the app allows actions and the hook this one."""
        if self.read_only or self._authorize is None:
            return False
        return bool(self._authorize(request, action))

    def render(self, request: Request, template: str, status: int = HTTPStatus.OK, **context: Any) -> Response:
        browser_token, new = self.csrf.browser_token(request)
        nonce = secrets.token_urlsafe(16)
        body = self.templates.get_template(template).render(
            request=request, url=request.url, can=lambda action: self.can(request, action),
            read_only=self.read_only, scope=self.organization(request), nonce=nonce,
            csrf_field=FIELD_NAME, csrf_token=self.csrf.form_token(browser_token), **context,
        )
        headers = [
            ("Content-Security-Policy",
             f"default-src 'none'; style-src 'self'; img-src 'self'; script-src 'nonce-{nonce}'; "
             "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "same-origin"),
            ("Cache-Control", "no-store"),
        ]
        if new:
            secure = request.environ.get("wsgi.url_scheme") == "https"
            headers.append(self.csrf.cookie_header(browser_token, request.root + "/", secure=secure))
        return Response(body.encode("utf-8"), status=status, headers=headers)

    def error_page(self, request: Request, status: int, code: str, message: str, *, refused: bool = False) -> Response:
        return self.render(request, "error.html", status=status, code=code, message=message, refused=refused)


def create_app(
    engine: Any,
    *,
    read_only: bool = True,
    authorize: Optional[Authorize] = None,
    organization_id: OrganizationScope = None,
    secret: Optional[bytes] = None,
) -> Dashboard:
    """Build the operator dashboard as a WSGI application.

    Args:
        engine: The queue's Engine (``rl.create_engine``).
        read_only: When True (the default) every POST is refused with ``web.read_only``
            and no action buttons are drawn.
        authorize: ``authorize(request, action) -> bool``, asked before each page
            (action ``"view"``) and each action (``"cancel"``, ``"retry"``, ``"replay"``,
            ``"pause"``, ``"resume"``, ``"trigger"``). ``request.environ`` is the WSGI
            environ; mounted in Flask or Django, ``request.host_request`` is that
            framework's request (its user, its session). Without a hook every page
            can be read and every action is refused.
        organization_id: Scope every page and action to one organization: a fixed id,
            or a callable ``(request) -> id or None`` (None: every organization).
        secret: The CSRF key, the same in every process serving the dashboard; a
            random one per process when None.

    Returns:
        The WSGI app.

    Example:
        >>> app = create_app(engine, read_only=False,                          # doctest: +SKIP
        ...                  authorize=lambda request, action: is_admin(request.environ))
        >>> wsgiref.simple_server.make_server("127.0.0.1", 8080, app).serve_forever()  # doctest: +SKIP
    """
    return Dashboard(engine, read_only=read_only, authorize=authorize, organization_id=organization_id, secret=secret)
