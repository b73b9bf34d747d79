"""The operator dashboard: a WSGI app over the queue's operator reads and actions.

Needs the ``dashboard`` extra (Jinja2). Serve it with ``runledger-sync dashboard``,
mount it in Flask (``Runledger(app, dashboard="/jobs")``) or Django
(``path("jobs/", include("runledger_sync.contrib.django.urls"))``), or hand
:func:`create_app`'s result to any WSGI server. It serves nobody until it is given an
authorize hook (:func:`allow_anyone` is the explicit "everyone who can reach it").
"""

from runledger_sync.web.app import Dashboard, Setup, allow_anyone, create_app
from runledger_sync.web.hosts import AllowedHosts
from runledger_sync.web.http import HostForm

__all__ = ["AllowedHosts", "Dashboard", "HostForm", "Setup", "allow_anyone", "create_app"]
