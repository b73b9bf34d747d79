"""The dashboard's WSGI application: routing, rendering, the read-only switch and the authorize hook.

Views live in ``views_*.py``; each is a function ``(dashboard, request, **url_parts)
-> Response`` listed in :data:`ROUTES`. A POST route names its action in the URL
(the ``action`` part), which is what the authorize hook is asked about. Every page is plain HTML from autoescaping
Jinja2 templates, usable without JavaScript: a page whose ``<main>`` carries
``data-live`` is kept up to date by ``static/live.js``, the one script, served from
here (the policy allows scripts from this origin only, none inline).

Without an authorize hook nothing but the stylesheet and that script is served:
reading jobs needs a decision as much as acting on them does (:func:`allow_anyone`
is that decision made out loud).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import runledger_sync as rl
from runledger_sync.core.dashboard_errors import (
    ActionForbidden,
    AuthorizeHookMissing,
    DashboardReadOnly,
    DashboardRefusal,
    HostNotAllowed,
)
from runledger_sync.core.errors import MissingExtra
from runledger_sync.core.evidence import CALLED_BY_HEADING, traceback_parts

try:
    import jinja2
except ImportError:  # the dashboard extra; the rest of the library works without it
    raise MissingExtra("dashboard", "Jinja2") from None
from runledger_sync.logging import get_logger
from runledger_sync.web import (
    views_batches, views_bulk, views_jobs, views_operations, views_overview, views_queues, views_workflows,
)
from runledger_sync.web.csrf import FIELD_NAME, CsrfGuard, check_origin
from runledger_sync.web.hosts import AllowedHosts
from runledger_sync.web.http import HostForm, Request, Response

PACKAGE_DIR = Path(__file__).resolve().parent
log = get_logger(__name__)

#: ``authorize(request, action)``: False refuses; True allows; a non-empty str allows and is the user's id.
Authorize = Callable[[Any, str], Union[bool, str]]
OrganizationScope = Union[str, Callable[[Any], Optional[str]], None]

ROUTES: list[tuple[str, re.Pattern[str], Callable[..., Response]]] = [
    ("GET", re.compile(r"/"), views_overview.overview),
    ("GET", re.compile(r"/jobs"), views_jobs.jobs_list),
    ("GET", re.compile(r"/jobs/(?P<job_id>[0-9a-fA-F-]{32,36})"), views_jobs.job_page),
    # A bulk action over the list's filter: the GET is its confirmation page (the dry-run count), the POST acts.
    ("GET", re.compile(r"/jobs/(?P<action>bulk_cancel|bulk_retry|bulk_delete|bulk_update)"), views_bulk.bulk_confirm),
    ("POST", re.compile(r"/jobs/(?P<action>bulk_cancel|bulk_retry|bulk_delete|bulk_update)"), views_bulk.bulk_act),
    ("GET", re.compile(r"/operations"), views_bulk.operations),
    ("POST", re.compile(r"/jobs/(?P<job_id>[0-9a-fA-F-]{32,36})/(?P<action>cancel|retry|replay_job)"),
     views_jobs.job_action),
    ("GET", re.compile(r"/dead-letters"), views_operations.dead_letters),
    # replay: the jobs ticked in the form; replay_dead_letters: every one the page's filter matches.
    ("POST", re.compile(r"/dead-letters/(?P<action>replay|replay_dead_letters)"), views_operations.replay),
    ("GET", re.compile(r"/schedules"), views_operations.schedules),
    ("POST", re.compile(r"/schedules/(?P<action>pause|resume|trigger)"), views_operations.schedule_action),
    ("GET", re.compile(r"/workflows"), views_workflows.workflows),
    ("POST", re.compile(r"/workflows/(?P<action>cancel_workflow_run|complete_external_step)"),
     views_workflows.workflow_action),
    ("GET", re.compile(r"/batches"), views_batches.batches),
    ("GET", re.compile(r"/queues"), views_queues.queues),
    # The actions are named as the API calls they make, apart from the schedules' pause and
    # resume: a hook that lets someone pause a schedule need not let them stop a queue.
    ("POST", re.compile(r"/queues/(?P<action>pause_queue|resume_queue|configure_queue)"), views_queues.queue_action),
]

#: The files under static/ served without asking the hook: they hold no data.
STATIC_FILES = {
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
    "/static/live.js": ("live.js", "text/javascript; charset=utf-8"),
}
#: Every page's policy: scripts and fetches from this origin only (live.js re-fetching the page).
PAGE_POLICY = ("default-src 'none'; style-src 'self'; img-src 'self'; script-src 'self'; connect-src 'self'; "
               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

_STATUS_OF_CODE = {
    "job.not_found": HTTPStatus.NOT_FOUND,
    "schedule.not_found": HTTPStatus.NOT_FOUND,
    "workflow.run_not_found": HTTPStatus.NOT_FOUND,
    "batch.not_found": HTTPStatus.NOT_FOUND,
    "workflow.external_step_not_found": HTTPStatus.NOT_FOUND,
    "queue.not_found": HTTPStatus.NOT_FOUND,
    "job.invalid_state_transition": HTTPStatus.CONFLICT,
    "workflow.run_finished": HTTPStatus.CONFLICT,
    "workflow.external_step_not_waiting": HTTPStatus.CONFLICT,
    "workflow.external_step_not_external": HTTPStatus.CONFLICT,
    # The dashboard is fine; what it reads is not there yet or not reachable: try again later.
    "db.schema_mismatch": HTTPStatus.SERVICE_UNAVAILABLE,
    "db.connection_failed": HTTPStatus.SERVICE_UNAVAILABLE,
}
_STATUS_OF_CATEGORY = {"validation": HTTPStatus.BAD_REQUEST, "forbidden": HTTPStatus.FORBIDDEN,
                       "conflict": HTTPStatus.CONFLICT}


def allow_anyone(request: Any, action: str) -> bool:
    """An authorize hook that lets in everyone who can reach the dashboard: pass it to say so.

    With ``read_only=True`` (the default) that is every page, payloads included, and
    no action; with ``read_only=False`` every action too. Fit for a dashboard only you
    can reach (a loopback address, a VPN) or one behind a proxy that authenticates.
    """
    return True


@dataclass(frozen=True)
class Setup:
    """How this dashboard was set up, in the words its refusals use to say what to change.

    Attributes:
        authorize: How to give an authorize hook.
        enable_actions: How to turn read-only off.
        migrate: The command that creates or upgrades the job tables.
        allow_host: How to add a host name the dashboard answers to.
    """

    authorize: str
    enable_actions: str
    migrate: str
    allow_host: str = "create_app(engine, allowed_hosts=[...]) names the host names it answers to besides loopback"


#: The words of :func:`create_app`, the dashboard used as a plain WSGI app.
STANDALONE = Setup(
    authorize=("pass create_app(engine, authorize=hook), hook(request, action) returning True or the user's id; "
               "authorize=runledger_sync.web.allow_anyone lets in everyone who can reach it"),
    enable_actions="create_app(engine, read_only=False, authorize=...) enables actions",
    migrate="runledger-sync migrate",
)


def _when(moment: Optional[datetime]) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _when_in(moment: Optional[datetime], zone_name: str) -> str:
    """The moment on the wall clock of ``zone_name`` (a schedule's own), with the zone's abbreviation and offset."""
    if moment is None:
        return "-"
    try:
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        return "-"  # a zone this machine's tz database lacks: the UTC time beside it still tells
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z (UTC%z)")


def _duration(span: timedelta) -> str:
    """A span as its two largest units: ``3 d 4 h``, ``12 min 5 s``."""
    seconds = int(span.total_seconds())
    parts = [(seconds // 86400, "d"), (seconds // 3600 % 24, "h"), (seconds // 60 % 60, "min"), (seconds % 60, "s")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    return " ".join(f"{value} {unit}" for value, unit in parts[:2])


class Dashboard:
    """The WSGI app returned by :func:`create_app`; call it as any WSGI application."""

    def __init__(self, engine: Any, *, read_only: bool, authorize: Optional[Authorize],
                 organization_id: OrganizationScope, secret: Optional[bytes], setup: Setup = STANDALONE,
                 allowed_hosts: Optional[AllowedHosts] = None) -> None:
        self.engine = engine
        self.read_only = read_only
        self.setup = setup
        self.allowed_hosts = allowed_hosts if allowed_hosts is not None else AllowedHosts.of()
        self._authorize = authorize
        self._organization = organization_id
        self.csrf = CsrfGuard(secret)
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(PACKAGE_DIR / "templates")),
            autoescape=True,  # every page shows user data: job types, payloads, error messages
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["when"] = _when
        self.templates.filters["when_in"] = _when_in
        self.templates.filters["duration"] = _duration
        self.templates.filters["traceback_parts"] = traceback_parts
        self.templates.globals["called_by_heading"] = CALLED_BY_HEADING.strip()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        return self.respond(Request(environ)).wsgi(start_response)

    def mounted(self, environ: dict[str, Any], prefix: str, rest: str, form: bytes, host_request: Any, *,
                session_value: Optional[str] = None, host_form: Optional[HostForm] = None) -> Response:
        """Answer a request a host framework routed here: ``prefix`` is the mount point, ``rest`` the path below it.

        The host has parsed the form already (its own CSRF middleware may have), so it passes the
        form in, urlencoded. The hooks are given ``host_request``; ``session_value`` binds the CSRF
        token to the host's session, and ``host_form`` says the host checks forms itself.
        """
        environ = {
            **environ, "SCRIPT_NAME": prefix.rstrip("/"), "PATH_INFO": "/" + rest.lstrip("/"),
            "wsgi.input": io.BytesIO(form), "CONTENT_LENGTH": str(len(form)),
        }
        return self.respond(Request(environ, host_request=host_request, session_value=session_value,
                                    host_form=host_form))

    def respond(self, request: Request) -> Response:
        """Answer one request; whatever goes wrong, the answer is a page with every security header."""
        try:
            return self._respond(request)
        except Exception:  # the request's boundary: log it, and answer a page rather than a bare 500
            log.exception("dashboard request failed", extra={"path": request.path, "method": request.method})
            return self.error_page(request, HTTPStatus.INTERNAL_SERVER_ERROR, "web.internal_error",
                                   "the dashboard failed to answer this request; the server log has the details")

    def _respond(self, request: Request) -> Response:
        # First of all, static files too: a rebinding page must learn nothing, not even that this is a dashboard.
        try:
            self.allowed_hosts.check(request.host_name())
        except HostNotAllowed as refused:
            log.info("dashboard request refused", extra={"path": request.path, "error_code": refused.code})
            return self.error_page(request, HTTPStatus.BAD_REQUEST, refused.code, refused.message,
                                   refused=True, hint=self.setup.allow_host)
        if request.method == "GET" and request.path in STATIC_FILES:
            name, content_type = STATIC_FILES[request.path]
            return Response((PACKAGE_DIR / "static" / name).read_bytes(), content_type=content_type)
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
            hint = f"run `{self.setup.migrate}`" if error.code == "db.schema_mismatch" else None
            return self.error_page(request, status, error.code, error.message,
                                   refused=isinstance(error, DashboardRefusal), hint=hint)
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
        # Read-only first: such an app refuses every POST whatever the form says.
        if self.read_only:
            raise DashboardReadOnly(self.setup.enable_actions)
        if request.host_form is None:
            check_origin(request)
        # The hook names the user, whom the token must have been drawn for.
        self.require(request, action)
        if request.host_form is None:
            self.csrf.check(request)

    def require_action(self, request: Request, action: str) -> None:
        """Raise unless this app allows actions and the hook ``action``: for a page that only leads to one (a confirmation).

        Raises:
            DashboardReadOnly: the app is read-only.
            ActionForbidden: the hook refused.
        """
        if self.read_only:
            raise DashboardReadOnly(self.setup.enable_actions)
        self.require(request, action)

    def hook_argument(self, request: Request) -> Any:
        """What the hooks are given: the host framework's request when mounted, else the dashboard's."""
        return request.host_request if request.host_request is not None else request

    def require(self, request: Request, action: str) -> None:
        """Raise unless the authorize hook allows ``action``; remember the user it names on ``request.user``.

        Raises:
            AuthorizeHookMissing: there is no hook (nothing is served without one).
            ActionForbidden: the hook refused.
        """
        if self._authorize is None:
            raise AuthorizeHookMissing(f"this dashboard has no authorize hook, so it serves nobody: {self.setup.authorize}")
        answer = self._authorize(self.hook_argument(request), action)
        if not answer:
            raise ActionForbidden(f"the authorize hook refused {action!r}", action=action)
        request.user = answer if isinstance(answer, str) else ""

    def organization(self, request: Request) -> Optional[str]:
        """The organization this request is scoped to, or None for every organization."""
        if callable(self._organization):
            return self._organization(self.hook_argument(request))
        return self._organization

    def can(self, request: Request, action: str) -> bool:
        """Whether to show the buttons of ``action``: the app allows actions and the hook this one."""
        if self.read_only or self._authorize is None:
            return False
        return bool(self._authorize(self.hook_argument(request), action))

    def render(self, request: Request, template: str, status: int = HTTPStatus.OK, **context: Any) -> Response:
        """A page of the dashboard; its forms carry the CSRF token of this browser and user."""
        if request.host_form is not None:
            field, token, cookie = request.host_form.field, request.host_form.token, None
        else:
            value, new = self.csrf.session_value(request)
            field, token = FIELD_NAME, self.csrf.form_token(value, request.user)
            secure = request.environ.get("wsgi.url_scheme") == "https"
            cookie = self.csrf.cookie_header(value, request.root + "/", secure=secure) if new else None
        response = self._page(request, template, status, scope=self.organization(request),
                              can=lambda action: self.can(request, action), csrf_field=field, csrf_token=token,
                              **context)
        if cookie is not None:
            response.headers.append(cookie)
        return response

    def error_page(self, request: Request, status: int, code: str, message: str, *, refused: bool = False,
                   hint: Optional[str] = None) -> Response:
        """An error page; it asks no hook (one may be what failed) and draws no form."""
        response = self._page(request, "error.html", status, scope=None, can=lambda action: False,
                              csrf_field=FIELD_NAME, csrf_token="", code=code, message=message, refused=refused,
                              hint=hint)
        response.error_code = code
        return response

    def _page(self, request: Request, template: str, status: int, **context: Any) -> Response:
        body = self.templates.get_template(template).render(
            request=request, url=request.url, read_only=self.read_only, **context,
        )
        return Response(body.encode("utf-8"), status=status, headers=[("Content-Security-Policy", PAGE_POLICY)])


def create_app(
    engine: Any,
    *,
    read_only: bool = True,
    authorize: Optional[Authorize] = None,
    organization_id: OrganizationScope = None,
    secret: Optional[bytes] = None,
    allowed_hosts: Optional[Iterable[str]] = None,
) -> Dashboard:
    """Build the operator dashboard as a WSGI application.

    Args:
        engine: The queue's Engine (``rl.create_engine``).
        read_only: When True (the default) every POST is refused with ``web.read_only``
            and no action buttons are drawn.
        authorize: ``authorize(request, action)``, asked before each page (action
            ``"view"``) and each action (``"cancel"``, ``"retry"``, ``"replay_job"`` (the job
            page's "Run again": an audited replay, recorded with the user the hook names), ``"replay"`` (the
            dead letters ticked), ``"replay_dead_letters"`` (every one a filter matches),
            ``"pause"``, ``"resume"``, ``"trigger"`` for schedules; ``"pause_queue"``,
            ``"resume_queue"``, ``"configure_queue"`` for queues; ``"cancel_workflow_run"``,
            ``"complete_external_step"`` for workflow runs; ``"bulk_cancel"``, ``"bulk_retry"``,
            ``"bulk_delete"``, ``"bulk_update"`` for the jobs list's actions on every job its
            filter matches, asked for the confirmation page too and recorded in the operations
            with the user the hook names). It returns False to refuse, True
            to allow, or the user's id (a non-empty str, the same for every action) to
            allow and bind that user's forms to them (a form token read by one user is
            refused for another). ``request.environ`` is the WSGI environ; mounted in
            Flask or Django the hook is given that framework's request instead.
            Without a hook nothing is served (``web.authorize_missing``); pass
            :func:`allow_anyone` to let in everyone who can reach the app.
        organization_id: Scope every page and action to one organization: a fixed id,
            or a callable ``(request) -> id or None`` (None: every organization),
            given the same request as ``authorize``.
        secret: The CSRF key, the same in every process serving the dashboard; a
            random one per process when None.
        allowed_hosts: The host names (``Host`` header, any port) the app answers to
            besides ``localhost``, ``127.0.0.1`` and ``::1``, e.g. ``["ops.example.com"]``;
            ``"*"`` answers to any (behind a proxy that checks the host itself). Any
            other host is refused with 400 ``web.host_not_allowed``, which is what stops
            a page whose domain was re-pointed at the dashboard (DNS rebinding).

    Returns:
        The WSGI app.

    Raises:
        ConfigError: ``allowed_hosts`` is a bare string or holds something not a host name.

    Example:
        >>> app = create_app(engine, read_only=False,                          # doctest: +SKIP
        ...                  authorize=lambda request, action: user_of(request.environ))
        >>> wsgiref.simple_server.make_server("127.0.0.1", 8080, app).serve_forever()  # doctest: +SKIP
    """
    return Dashboard(engine, read_only=read_only, authorize=authorize, organization_id=organization_id, secret=secret,
                     allowed_hosts=AllowedHosts.of(allowed_hosts))
