"""The dashboard's refusals: no authorize hook, a read-only dashboard, a forged or cross-origin form, a denied action,
a host name not its own.

Drawn in the tree of :mod:`runledger_sync.core.errors`; import them from here.
"""

from __future__ import annotations

from runledger_sync.core.errors import RunledgerError, ValidationError


class DashboardRefusal(RunledgerError):
    """The dashboard refused the request."""

    code = "web.refused"
    category = "forbidden"


class AuthorizeHookMissing(DashboardRefusal):
    """The dashboard has no authorize hook, so it serves nobody: pass authorize=... (see the message)."""

    code = "web.authorize_missing"


class DashboardReadOnly(DashboardRefusal):
    """The dashboard is read-only, so every action is refused; the message says how it was set up to allow them."""

    code = "web.read_only"


class CsrfRejected(DashboardRefusal):
    """The form's CSRF token is missing or does not match this browser's session and user; reload the page and try again."""

    code = "web.csrf_rejected"


class CrossOriginRejected(CsrfRejected):
    """The form was posted from another origin (another site, scheme or port) than the dashboard's own."""

    code = "web.cross_origin_rejected"


class OriginMissing(CsrfRejected):
    """The form was posted without an Origin or Sec-Fetch-Site header, which every current browser sends; send Origin."""

    code = "web.origin_missing"


class ActionForbidden(DashboardRefusal):
    """The authorize hook refused this action."""

    code = "web.action_forbidden"


class IncompleteRequestBody(ValidationError):
    """The request body ended before its Content-Length, or did not arrive in time."""

    code = "web.incomplete_body"


class HostNotAllowed(ValidationError):
    """The request names a host the dashboard does not answer to (a page whose domain was re-pointed at it)."""

    code = "web.host_not_allowed"
