"""The dashboard mounted in a Flask app by :class:`runledger_sync.contrib.flask.Runledger` (``dashboard="/jobs"``).

This module imports only the public ``runledger_sync`` API.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import urlencode

from flask import Flask, Response, current_app, request, session

DASHBOARD_READ_ONLY_KEY = "RUNLEDGER_DASHBOARD_READ_ONLY"
DASHBOARD_AUTHORIZE_KEY = "RUNLEDGER_DASHBOARD_AUTHORIZE"
DASHBOARD_ORGANIZATION_KEY = "RUNLEDGER_DASHBOARD_ORGANIZATION"
DASHBOARD_ALLOWED_HOSTS_KEY = "RUNLEDGER_DASHBOARD_ALLOWED_HOSTS"

#: The Flask session key of the random value the dashboard's form tokens are bound to.
DASHBOARD_SESSION_KEY = "runledger_csrf"
SESSION_VALUE_BYTES = 32
SESSION_VALUE_LENGTH = 43  # token_urlsafe(32)


def mount_dashboard(app: Flask, prefix: str, engine: Any) -> None:
    """Route ``prefix`` and everything below it to the dashboard, as views of this app.

    Views rather than a WSGI middleware: each dashboard request, its hooks included,
    runs inside this app's request context, so ``flask.request``, ``flask.g``,
    ``flask.session`` and the app's login extension all work in them; the hooks are
    given the Flask request itself.
    """
    from runledger_sync.web import AllowedHosts, Dashboard, Setup

    secret = app.secret_key.encode() if isinstance(app.secret_key, str) else app.secret_key
    setup = Setup(
        authorize=(f"set app.config[{DASHBOARD_AUTHORIZE_KEY!r}] = hook, hook(request, action) returning True or "
                   "the user's id (it runs in the request context: flask.request, flask.session, current_user); "
                   "runledger_sync.web.allow_anyone lets in everyone who can reach the app"),
        enable_actions=f"set app.config[{DASHBOARD_READ_ONLY_KEY!r}] = False to enable actions",
        migrate="flask runledger migrate",
        allow_host=f"set app.config[{DASHBOARD_ALLOWED_HOSTS_KEY!r}] = [...] to the host names the app is reached by",
    )
    # SERVER_NAME, when set, is the name the app says it is reached by: the dashboard answers to it too.
    allowed_hosts = AllowedHosts.of(app.config.get(DASHBOARD_ALLOWED_HOSTS_KEY), bound_to=app.config.get("SERVER_NAME"))
    dashboard = Dashboard(
        engine,
        read_only=as_bool(app.config.get(DASHBOARD_READ_ONLY_KEY, True)),
        authorize=app.config.get(DASHBOARD_AUTHORIZE_KEY),
        organization_id=app.config.get(DASHBOARD_ORGANIZATION_KEY),
        secret=secret or None,
        setup=setup,
        allowed_hosts=allowed_hosts,
    )
    prefix = "/" + prefix.strip("/")

    def view(rest: str = "") -> Any:
        # Flask has parsed the form, whichever its encoding; the dashboard reads it urlencoded.
        form = urlencode(list(request.form.lists()), doseq=True).encode()
        answer = dashboard.mounted(request.environ, request.script_root + prefix, rest, form,
                                   request._get_current_object(),  # type: ignore[attr-defined]
                                   session_value=session_value())
        return Response(answer.body, status=answer.status, headers=answer.all_headers())

    methods = ["GET", "POST"]
    app.add_url_rule(prefix + "/", "runledger_dashboard", view, methods=methods)
    app.add_url_rule(prefix + "/<path:rest>", "runledger_dashboard_page", view, methods=methods)


def session_value() -> str | None:
    """A random value kept in this user's Flask session, which the form tokens are bound to.

    None without a secret key (Flask then has no session); the dashboard keeps the value
    in a cookie of its own instead.
    """
    if not current_app.secret_key:
        return None
    value = session.get(DASHBOARD_SESSION_KEY)
    if not isinstance(value, str) or len(value) != SESSION_VALUE_LENGTH:
        value = session[DASHBOARD_SESSION_KEY] = secrets.token_urlsafe(SESSION_VALUE_BYTES)
    return value


def as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)
