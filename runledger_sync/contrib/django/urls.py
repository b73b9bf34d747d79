"""The operator dashboard as Django views: ``path("jobs/", include("runledger_sync.contrib.django.urls"))``.

The options come from ``RUNLEDGER["DASHBOARD"]`` (see :mod:`.settings`). Without an
AUTHORIZE hook only staff users (``request.user.is_staff``, from Django's
authentication middleware) may see the dashboard or act; the hook is called as
``authorize(request, action)`` with ``request.host_request`` the Django request.
The views are exempt from Django's CSRF middleware because the dashboard checks
its own token on every action. The queue's engine is the app's (``DATABASES``).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from runledger_sync.contrib.django import _app_config, get_engine

app_name = "runledger"
_lock = threading.Lock()
#: The dashboard and the engine it was built on; rebuilt when the app config's engine changes (after dispose()).
_built: dict[str, Any] = {}


def staff_only(request: Any, action: str) -> bool:
    """The default hook: Django's staff users may read and act, nobody else."""
    user = getattr(request.host_request, "user", None)
    return bool(getattr(user, "is_staff", False))


def _hook(spec: Any) -> Any:
    if spec is None:
        return staff_only
    if callable(spec):
        return spec
    module_name, _, attribute = str(spec).partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def _dashboard() -> Any:
    """The dashboard app, built on first use (settings are read once Django is ready)."""
    from runledger_sync.web import create_app

    engine = get_engine()
    with _lock:
        if _built.get("engine") is not engine:
            options = _app_config().runledger_settings.dashboard
            secret = settings.SECRET_KEY.encode() if settings.SECRET_KEY else None
            _built["app"] = create_app(engine, read_only=options.read_only, authorize=_hook(options.authorize),
                                       organization_id=options.organization, secret=secret)
            _built["engine"] = engine
        return _built["app"]


@csrf_exempt
def dashboard(request: HttpRequest, rest: str = "") -> HttpResponse:
    prefix = request.path[: len(request.path) - len(rest)] if rest else request.path
    # Django has parsed the form, whichever its encoding; the dashboard reads it urlencoded.
    form = urlencode(list(request.POST.lists()), doseq=True).encode()
    answer = _dashboard().mounted(request.META, prefix, rest, form, request)
    response = HttpResponse(answer.body, status=answer.status, content_type=answer.content_type)
    for name, value in answer.headers:
        if name == "Set-Cookie":
            response.cookies.load(value)  # Django sends (and its test client keeps) cookies from here
        else:
            response[name] = value
    return response


urlpatterns = [
    path("", dashboard, name="dashboard"),
    path("<path:rest>", dashboard, name="dashboard-page"),
]
