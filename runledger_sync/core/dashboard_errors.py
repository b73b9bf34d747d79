"""The dashboard's refusals: a read-only dashboard, a forged form, an action the authorize hook denied.

Drawn in the tree of :mod:`runledger_sync.core.errors`, which re-exports them.
"""

from __future__ import annotations

from runledger_sync.core.errors import RunledgerError


class DashboardRefusal(RunledgerError):
    """The dashboard refused the request."""

    code = "web.refused"
    category = "forbidden"


class DashboardReadOnly(DashboardRefusal):
    """The dashboard is read-only: create_app(engine, read_only=False, authorize=...) enables actions."""

    code = "web.read_only"


class CsrfRejected(DashboardRefusal):
    """The form's CSRF token is missing or does not match this browser's cookie; reload the page and try again."""

    code = "web.csrf_rejected"


class ActionForbidden(DashboardRefusal):
    """The authorize hook refused this action."""

    code = "web.action_forbidden"
