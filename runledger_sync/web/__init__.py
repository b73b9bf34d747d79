"""The operator dashboard: a WSGI app over the queue's operator reads and actions.

Needs the ``dashboard`` extra (Jinja2). Serve it with ``runledger-sync dashboard``,
mount it in Flask (``Runledger(app, dashboard="/jobs")``) or Django
(``path("jobs/", include("runledger_sync.contrib.django.urls"))``), or hand
:func:`create_app`'s result to any WSGI server.
"""

from runledger_sync.web.app import Dashboard, create_app

__all__ = ["Dashboard", "create_app"]
