"""Build SQLAlchemy engines from database URLs."""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional, Sequence
from urllib.parse import quote

import sqlalchemy
from sqlalchemy.engine import URL, Connection, Engine, make_url

from runledger_sync.core.errors import ConfigError
from runledger_sync.db.connection_loss import end_connections_on_loss
from runledger_sync.db.pool_mode import (
    DEFAULT_POOL_MODE,
    POLICY_OPTION,
    ConnectionPolicy,
    PoolMode,
    parse_pool_mode,
    pool_mode_from_env,
)

DATABASE_URL_VARIABLES = ("RUNLEDGER_DATABASE_URL", "DATABASE_URL")
SCHEMA_VARIABLE = "RUNLEDGER_SCHEMA"
DEFAULT_POOL_SIZE = 10
DEFAULT_MAX_OVERFLOW = 40


def database_url_from_env(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Return the first non-blank of RUNLEDGER_DATABASE_URL and DATABASE_URL, or None."""
    environ = os.environ if environ is None else environ
    for name in DATABASE_URL_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


#: The driver of every engine runledger-sync builds: the worker's LISTEN connection
#: and the store's prepared statements are written for it.
DRIVER = "psycopg2"
#: Drivers a URL may name that connect the same way (libpq, the same URL options):
#: none, which SQLAlchemy 2.1 reads as psycopg (3), and psycopg itself.
_SAME_CONNECTION_DRIVERS = frozenset({"psycopg2", "psycopg"})


def normalize_url(url: str | URL) -> URL:
    """Parse a URL and pin the psycopg2 driver, accepting the ``postgres://`` spelling.

    ``postgresql://`` (psycopg 3 to SQLAlchemy 2.1, psycopg2 to 2.0) and
    ``postgresql+psycopg://`` both become ``postgresql+psycopg2://``: the same
    server, user and options, through the driver the worker is built on. Your
    application's own engines may keep either driver; both are installed.

    Raises:
        ConfigError: the URL cannot be parsed, is not a PostgreSQL URL, or names
            a driver other than psycopg2 or psycopg (asyncpg, pg8000, ...).
    """
    if isinstance(url, str) and url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    try:
        parsed = make_url(_hosts_into_query(url) if isinstance(url, str) else url)
        parsed = _one_host_list(parsed)
    except ConfigError:
        raise
    except Exception as exc:  # SQLAlchemy raises ArgumentError or ValueError
        raise ConfigError([f"database url is not a valid URL ({type(exc).__name__})"]) from exc
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError([f"database url must be a postgresql:// URL, got {mask_url(parsed)}"])
    driver = parsed.drivername.partition("+")[2]
    if driver and driver not in _SAME_CONNECTION_DRIVERS:
        raise ConfigError([
            f"database url names the driver {driver!r}, which runledger-sync does not connect with; "
            f"write postgresql:// (runledger-sync uses {DRIVER}), got {mask_url(parsed)}"
        ])
    return parsed.set(drivername=f"postgresql+{DRIVER}")


# libpq's multi-host URL (``postgresql://u@h1:5432,h2:5433/app``) names several servers in
# its netloc, which SQLAlchemy cannot parse when any of them has a port. The netloc as
# SQLAlchemy splits it: scheme, then userinfo (the password runs to the '@'), then hosts.
_NETLOC = re.compile(r"^(?P<head>[\w+]+://(?:[^:/@]*(?::[^@]*)?@)?)(?P<hosts>[^/?#]*)(?P<tail>.*)$", re.DOTALL)
# One server of a list: a bracketed IPv6 address or a name, and an optional port.
_HOST_PORT = re.compile(r"^(?:\[(?P<ipv6>[^\]]*)\]|(?P<name>[^:]*))(?::(?P<port>\d*))?$")


def _hosts_into_query(url: str) -> str:
    """Move a netloc's comma-separated servers into libpq's ``host=h1,h2&port=p1,p2`` query form.

    The query form is the one SQLAlchemy hands to libpq untouched, so every server,
    IPv6 ones included, reaches libpq as the URL wrote it, in order (libpq tries them
    in turn and, with ``target_session_attrs=read-write``, keeps the one that takes writes).
    """
    found = _NETLOC.match(url)
    if found is None or "," not in found.group("hosts"):
        return url
    hosts, ports = _split_servers(found.group("hosts").split(","))
    path, _, query = found.group("tail").partition("?")
    if re.search(r"(?:^|&)(?:host|port)=", query):
        raise ConfigError(["database url names its servers twice (in the host list and as host= or port=); "
                           f"write one of them, got {mask_url(url)}"])
    # Entries stay percent-encoded as written (a socket directory is %2F...): SQLAlchemy decodes them once.
    added = "host=" + quote(",".join(hosts), safe=",:%")
    if any(ports):
        added += "&port=" + ",".join(ports)
    return f"{found.group('head')}{path}?{added}" + (f"&{query}" if query else "")


def _one_host_list(url: URL) -> URL:
    """Fold SQLAlchemy's repeated ``host=h1:p1&host=h2:p2`` into the comma form, which takes IPv6 addresses too."""
    host = url.query.get("host")
    if not isinstance(host, tuple):
        return url
    if "port" in url.query:
        raise ConfigError(["database url mixes host=h:p pairs with a port= list; "
                           f"write host=h1:p1&host=h2:p2 or host=h1,h2&port=p1,p2, got {mask_url(url)}"])
    hosts, ports = _split_servers(host)
    query = {**url.query, "host": ",".join(hosts)}
    if any(ports):
        query["port"] = ",".join(ports)
    return url.set(query=query)


def _split_servers(servers: Sequence[str]) -> tuple[list[str], list[str]]:
    hosts: list[str] = []
    ports: list[str] = []
    for server in servers:
        found = _HOST_PORT.match(server.strip())
        if found is None:
            raise ConfigError([f"database url names a server that is not host[:port]: {server!r}"])
        hosts.append(found.group("ipv6") if found.group("ipv6") is not None else found.group("name"))
        # An empty entry is libpq's: that server's default port.
        ports.append(found.group("port") or "")
    return hosts, ports


# A URL inside free text ends at whitespace, a quote or a parenthesis (messages
# write one as ``(postgresql://...)`` or ``'postgresql://...'``), and not on the
# punctuation of the sentence around it.
_URL_IN_TEXT = r"""[A-Za-z][A-Za-z0-9+.\-]*://(?:[^\s'"()<>]*[^\s'"()<>.,;:])?"""
# SQLAlchemy's own reading of the userinfo: the user has no ':' or '/', the
# password runs to the first '@'. Masking what it would send keeps every spelling hidden.
_USERINFO_PASSWORD = re.compile(r"^(?P<head>[^:]*://[^:/@]*:)[^@]*(?=@)")
# A parameter named like a secret: libpq's password and sslpassword, and whatever
# else a driver, proxy or service reads a credential from (auth_token, client_secret).
_MASKED_NAME = r"[A-Za-z0-9_]*(?:password|passwd|passphrase|secret|token)[A-Za-z0-9_]*"
# libpq takes every parameter as a URL query parameter too.
_MASKED_IN_QUERY = re.compile(rf"(?P<head>[?&]{_MASKED_NAME}=)[^&#]*", re.IGNORECASE)
# libpq's key=value form: spaces may surround '=', and a value is either bare, running
# to the next whitespace, or single-quoted with \' and \\ inside; an unclosed quote
# runs to the end of the text, so it is masked to the end.
_MASKED_PAIR = rf"""(?<![\w.\-])(?P<key>{_MASKED_NAME}\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|\S+)"""
# One pass over free text: where a URL starts, its own grammar decides what is secret,
# so a key=value inside its query is never read as a libpq pair.
_MASKED_IN_TEXT = re.compile(rf"(?P<url>{_URL_IN_TEXT})|{_MASKED_PAIR}", re.IGNORECASE)
MASK = "***"


def mask_url(url: str | URL) -> str:
    """Render a connection string with every secret replaced by ``***``, for messages and logs.

    A URL as given, with the userinfo password (``user:PASSWORD@``) masked and
    every query parameter named like a secret (``password``, ``sslpassword``,
    ``auth_token``, ...); or a libpq ``key=value`` string with those parameters'
    values masked, quoted ones (``password='a b'``) whole. A ``URL`` object is
    rendered as SQLAlchemy writes it, then masked alike. Anything else is shown
    as ``<unparseable url>``.
    """
    if isinstance(url, str) and "://" not in url and "=" in url:
        return mask_urls_in(url)
    try:
        rendered = url if isinstance(url, str) else url.render_as_string(hide_password=True)
        make_url(_hosts_into_query(rendered))
    except Exception:
        return "<unparseable url>"
    return _masked_url(rendered)


def mask_urls_in(text: str) -> str:
    """Return ``text`` with every secret of every connection string in it replaced by ``***``.

    Only the connection strings change: each URL is found by its ``scheme://``
    and each libpq pair by its secret-named key and its ``=``, and the secret
    cut out where their grammar puts it, so the rest of the text is left as it
    was, even when the password is a word that occurs in it.
    """

    def mask(found: re.Match[str]) -> str:
        if found.group("url") is not None:
            return _masked_url(found.group("url"))
        return f"{found.group('key')}{MASK}"

    return _MASKED_IN_TEXT.sub(mask, text)


def _masked_url(text: str) -> str:
    masked = _USERINFO_PASSWORD.sub(rf"\g<head>{MASK}", text, count=1)
    return _MASKED_IN_QUERY.sub(rf"\g<head>{MASK}", masked)


def create_engine(
    url: str | URL | None = None,
    *,
    schema: Optional[str] = None,
    pool_size: int = DEFAULT_POOL_SIZE,
    max_overflow: int = DEFAULT_MAX_OVERFLOW,
    pool_mode: PoolMode | str | None = None,
    **engine_options: Any,
) -> Engine:
    """Create an engine for the queue's database.

    Args:
        url: a PostgreSQL URL; defaults to RUNLEDGER_DATABASE_URL, then DATABASE_URL.
        schema: the schema holding the queue tables; defaults to RUNLEDGER_SCHEMA,
            then the connection's search_path (normally ``public``).
        pool_size: connections kept open; a worker needs about one per in-flight job.
        max_overflow: extra connections allowed under bursts.
        pool_mode: ``"session"`` (the default) when each connection keeps its own
            server session: directly, or through PgBouncer in session pooling mode.
            ``"transaction"`` behind a transaction-pooling proxy (PgBouncer
            ``pool_mode = transaction``): the store then prepares no statement and
            leaves no session state, and workers poll instead of LISTENing.
            Defaults to RUNLEDGER_POOL_MODE, then ``"session"``.
        **engine_options: passed to :func:`sqlalchemy.create_engine`.

    Returns:
        An Engine. Connecting is lazy: a bad host or password surfaces as
        ``ConnectionFailed`` on first use.

    Raises:
        ConfigError: no URL was given or found, or it is not a PostgreSQL URL, or
            the pool mode is neither ``"session"`` nor ``"transaction"``.

    A URL may name several servers as libpq does (``postgresql://app@h1:5432,h2:5432/app``,
    ``?host=h1,h2&port=5432,5432`` or ``?host=h1:5432&host=h2:5432``); with
    ``target_session_attrs=read-write`` each new connection goes to the one that
    takes writes. A read-only (25006), shut-down (57P01) or not-yet-accepting (57P03)
    answer closes the connection and the pool's others, so after a failover the
    next connection finds the new primary.

    Example:
        ``engine = rl.create_engine("postgresql://app@pgbouncer:6432/app", pool_mode="transaction")``
    """
    if url is None:
        url = database_url_from_env()
    if url is None:
        raise ConfigError(
            ["database url must be given as an argument, RUNLEDGER_DATABASE_URL or DATABASE_URL, got nothing"]
        )
    mode = parse_pool_mode(pool_mode) if pool_mode is not None else (pool_mode_from_env() or DEFAULT_POOL_MODE)
    options: dict[str, Any] = {
        # A restarted server leaves dead connections in the pool; ping before use.
        "pool_pre_ping": True,
        "pool_size": pool_size,
        "max_overflow": max_overflow,
    }
    options.update(engine_options)
    engine = sqlalchemy.create_engine(normalize_url(url), **options)
    # A failover's read-only or shutdown answers end the connection, not just the statement.
    end_connections_on_loss(engine)
    # One policy object for this engine and every engine derived from it: what one
    # of them detects about the sessions holds for all of them (they share the pool).
    engine.update_execution_options(**{POLICY_OPTION: ConnectionPolicy(mode)})
    schema = schema if schema is not None else (os.environ.get(SCHEMA_VARIABLE) or None)
    return with_schema(engine, schema)


def with_schema(bind: Engine | Connection, schema: Optional[str]) -> Any:
    """Return ``bind`` set up so the queue's statements address tables in ``schema``.

    Use this on an Engine or Connection your application built itself when the
    queue tables live outside the search path.
    """
    if not schema:
        return bind
    return bind.execution_options(schema_translate_map={None: schema})


def schema_of(bind: Engine | Connection) -> Optional[str]:
    """Return the schema the queue tables are addressed in, or None for the search path.

    Alembic's offline mode (``upgrade --sql``) hands migrations a connection that
    only records SQL and has no options: its statements address the search path.
    """
    options = bind.get_execution_options() if hasattr(bind, "get_execution_options") else {}
    translate = options.get("schema_translate_map") or {}
    return translate.get(None)
