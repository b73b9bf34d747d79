"""The operator dashboard as Django views: ``path("jobs/", include("runledger_sync.contrib.django.urls"))``.

The options come from ``RUNLEDGER["DASHBOARD"]`` (see :mod:`.settings`). The hooks are
given the Django request (``request.user``, ``request.session``). Without an AUTHORIZE
hook only staff users (``request.user.is_staff``, from Django's authentication
middleware) may see the dashboard or act, and without that middleware every page raises
``ImproperlyConfigured`` (``config.invalid``) saying so; an anonymous visitor refused a
page is sent to ``settings.LOGIN_URL`` with ``?next=``. Forms are checked by Django's own CSRF
protection (the views are ``csrf_protect``-ed and draw Django's token), so
``CSRF_TRUSTED_ORIGINS`` and the proxy settings apply as everywhere else in the project.
The host names it answers to are Django's ``ALLOWED_HOSTS``, checked on every request.
The queue's engine is the app's (``DATABASES``).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.middleware.csrf import get_token
from django.shortcuts import resolve_url
from django.urls import path
from django.views.decorators.csrf import csrf_protect

import runledger_sync as rl
from runledger_sync.contrib.django import _app_config, get_engine

app_name = "runledger"
#: The form field Django's CSRF middleware reads the token from.
DJANGO_CSRF_FIELD = "csrfmiddlewaretoken"
#: Headers Django's HttpResponse sets from the body itself.
_BODY_HEADERS = frozenset({"content-type", "content-length"})
_lock = threading.Lock()
#: The dashboard and the engine it was built on; rebuilt when the app config's engine changes (after dispose()).
_built: dict[str, Any] = {}


def staff_only(request: Any, action: str) -> bool:
    """The default hook: Django's staff users may read and act, nobody else."""
    user = getattr(request, "user", None)
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
    from runledger_sync.web import Dashboard, Setup

    engine = get_engine()
    with _lock:
        if _built.get("engine") is not engine:
            options = _app_config().runledger_settings.dashboard
            secret = settings.SECRET_KEY.encode() if settings.SECRET_KEY else None
            setup = Setup(
                authorize='set RUNLEDGER["DASHBOARD"]["AUTHORIZE"] = "module:hook", hook(request, action) -> bool',
                enable_actions='set RUNLEDGER["DASHBOARD"]["READ_ONLY"] = False in settings.py to enable actions',
                migrate="python manage.py runledger_migrate",
            )
            _built["app"] = Dashboard(engine, read_only=options.read_only, authorize=_hook(options.authorize),
                                      organization_id=options.organization, secret=secret, setup=setup)
            _built["engine"] = engine
        return _built["app"]


def _anonymous(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)  # absent without the authentication middleware
    return user is not None and not user.is_authenticated


def _check_default_hook(request: HttpRequest) -> None:
    # Without AUTHORIZE only staff get in; with no request.user every page would be a
    # 403 blaming a hook the project never set, so name what is missing instead.
    if _app_config().runledger_settings.dashboard.authorize is None and not hasattr(request, "user"):
        problem = rl.ConfigError([
            "the dashboard admits staff users unless RUNLEDGER[\"DASHBOARD\"][\"AUTHORIZE\"] names a hook, and "
            "that needs request.user: add \"django.contrib.auth.middleware.AuthenticationMiddleware\" to "
            "MIDDLEWARE (with django.contrib.auth and django.contrib.sessions), or set "
            "RUNLEDGER[\"DASHBOARD\"][\"AUTHORIZE\"] = \"module:hook\""])
        raise ImproperlyConfigured(str(problem))


@csrf_protect
def dashboard(request: HttpRequest, rest: str = "") -> HttpResponse:
    from runledger_sync.web import HostForm

    # Django's own host check (ALLOWED_HOSTS), which only some middleware makes: a page whose domain
    # was re-pointed at this server (DNS rebinding) gets Django's 400 (DisallowedHost) and no data.
    request.get_host()
    _check_default_hook(request)
    prefix = request.path[: len(request.path) - len(rest)] if rest else request.path
    # Django has parsed the form, whichever its encoding; the dashboard reads it urlencoded.
    form = urlencode(list(request.POST.lists()), doseq=True).encode()
    host_form = HostForm(DJANGO_CSRF_FIELD, get_token(request))
    answer = _dashboard().mounted(request.META, prefix, rest, form, request, host_form=host_form)
    if answer.error_code == "web.action_forbidden" and request.method == "GET" and _anonymous(request):
        # Refused because nobody is logged in: the login page can fix that, a 403 cannot.
        login = resolve_url(settings.LOGIN_URL)
        return HttpResponseRedirect(f"{login}?{urlencode({'next': request.get_full_path()})}")
    response = HttpResponse(answer.body, status=answer.status, content_type=answer.content_type)
    for name, value in answer.all_headers():
        if name.lower() in _BODY_HEADERS:
            continue
        if name == "Set-Cookie":
            response.cookies.load(value)  # Django sends (and its test client keeps) cookies from here
        else:
            response[name] = value
    return response


urlpatterns = [
    path("", dashboard, name="dashboard"),
    path("<path:rest>", dashboard, name="dashboard-page"),
]
