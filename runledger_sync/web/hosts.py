"""The host names the dashboard answers to: its guard against DNS rebinding.

A page on a domain whose DNS an attacker re-points at the dashboard's address is,
to the browser, of the same origin as the dashboard: its script can read every page,
form tokens included, and post the forms. Each of its requests still names the
attacker's domain in its ``Host`` header, so answering only to the dashboard's own
names stops it. The loopback names are always among them: only a page served from
this machine is addressed by them, and an attacker who serves pages here needs no
rebinding.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional
from urllib.parse import urlsplit

from runledger_sync.core.dashboard_errors import HostNotAllowed
from runledger_sync.core.errors import ConfigError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: The entry that lets every host name in: for a dashboard behind a proxy that checks the Host itself.
ANY_HOST = "*"
#: Addresses that mean "every interface" to a server: no client addresses a request to them.
_WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 - recognised, not bound to
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?")


def _name_of(entry: Any) -> str:
    """``entry`` as the dashboard compares Host headers: lowercased, without a port or IPv6 brackets."""
    if not isinstance(entry, str) or not entry.strip():
        raise ConfigError([f"allowed_hosts entries must be host names such as 'ops.example.com', got {entry!r}"])
    text = entry.strip().lower()
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        pass
    try:
        parts = urlsplit(f"//{text}")
        # The port is dropped (every port of an allowed name is allowed), but it must be a port.
        name = parts.hostname if parts.port is None or parts.port > 0 else None
    except ValueError:
        name = None
    if not name or not _HOST_NAME.fullmatch(name) or "/" in text or "@" in text:
        raise ConfigError([f"allowed_hosts entry {entry!r} is not a host name (give 'ops.example.com', "
                           "'10.0.0.5' or '*' for any)"])
    return name


@dataclass(frozen=True)
class AllowedHosts:
    """The host names one dashboard answers to, with any port; the loopback names always among them.

    Build it with :meth:`of`; ``any_host`` is set by the ``"*"`` entry.
    """

    names: frozenset[str]
    any_host: bool = False

    @classmethod
    def of(cls, entries: Optional[Iterable[str]] = None, *, bound_to: Optional[str] = None) -> "AllowedHosts":
        """The loopback names, ``entries``, and the name or address a server is ``bound_to`` (unless it is every interface).

        Raises:
            ConfigError: ``entries`` is a bare string, or one of them is not a host name (``config.invalid``).
        """
        if isinstance(entries, (str, bytes)):
            raise ConfigError([f"allowed_hosts must be a list of host names, got the string {entries!r}"])
        given = list(entries or ())
        names = {_name_of(entry) for entry in given if entry != ANY_HOST}
        if bound_to is not None and bound_to.strip().strip("[]") not in _WILDCARD_ADDRESSES:
            names.add(_name_of(bound_to))
        return cls(LOOPBACK_NAMES | names, any_host=ANY_HOST in given)

    def check(self, host: Optional[str]) -> None:
        """Raise HostNotAllowed unless ``host`` (the Host header's name, None without one) is one of these.

        A request without a Host header is let in: no browser sends one, and a
        rebinding attack needs a browser.
        """
        if self.any_host or host is None or host in self.names:
            return
        raise HostNotAllowed(f"this dashboard does not answer to the host name {host[:100]!r}")
