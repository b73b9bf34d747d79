"""``runledger-sync dashboard``: serve the operator dashboard with the standard library's WSGI server.

The command has no login of its own: whoever can reach its address is let in (read-only
unless ``--allow-actions``). Running it is that choice, made by someone who holds the
database URL; the address is 127.0.0.1 unless ``--host`` says otherwise. It answers only
to the loopback names, the ``--host`` it listens on and each ``--allowed-host``, so a web
page whose domain an attacker re-points at its address (DNS rebinding) cannot read it
through the browser.
"""

from __future__ import annotations

import argparse
import signal
import threading
from socketserver import ThreadingMixIn
from typing import Any, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import runledger_sync as rl
from runledger_sync.logging import get_logger
from runledger_sync.cli._core import EXIT_OK, command, open_engine
from runledger_sync.core.errors import extra_install_hint

log = get_logger("web")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
EXTRA_HINT = extra_install_hint("dashboard")
#: The Server header: the program, never the Python version behind it.
SERVER_NAME = "runledger-sync"
#: How long a connection may sit without sending what it announced (a request line,
#: a body shorter than its Content-Length) before its thread gives up on it.
READ_TIMEOUT_SECONDS = 30.0


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    # A slow page (a wide filter on a big table) must not hold up the others.
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_SECONDS
    server_version = SERVER_NAME

    def version_string(self) -> str:
        # The error pages of the HTTP layer itself (a malformed request line) name the server here.
        return SERVER_NAME

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        # One structured line per request, without the query string (it may carry search text).
        log.info("dashboard request", extra={"request_line": self.requestline.split("?", 1)[0],
                                                "status": args[1] if len(args) > 1 else None})


def _named_server(app: Any) -> Any:
    """``app`` with its own Server header, which wsgiref then sends instead of its own (naming Python)."""
    def serve(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, [*headers, ("Server", SERVER_NAME)], exc_info)
        return app(environ, start)
    return serve


def _dashboard_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to listen on (default {DEFAULT_HOST}); there is no login, so everyone who can "
                             "reach it can read every page")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on, 0 for any free one (default {DEFAULT_PORT})")
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="show and act on this organization's jobs only")
    parser.add_argument("--allow-actions", action="store_true",
                        help="enable cancel, retry, replay and the schedule actions for everyone who can reach "
                             "the address (read-only without it)")
    parser.add_argument("--allowed-host", dest="allowed_hosts", action="append", default=[], metavar="NAME",
                        help="a host name the dashboard answers to (the Host header, any port), besides localhost, "
                             "127.0.0.1, ::1 and --host; repeat for more; '*' answers to any (behind a proxy that "
                             "checks the host itself); other hosts get 400 web.host_not_allowed")


def _create_app(engine: Any, args: argparse.Namespace) -> Any:
    try:
        from runledger_sync.web import AllowedHosts, Dashboard, Setup, allow_anyone
    except ImportError as exc:
        error = rl.ConfigError([f"the dashboard cannot start: {exc}"])
        error.hint = EXTRA_HINT  # type: ignore[attr-defined]
        raise error from exc
    setup = Setup(authorize="`runledger-sync dashboard` lets in everyone who can reach its address",
                  enable_actions="start `runledger-sync dashboard` with --allow-actions to enable actions",
                  migrate="runledger-sync migrate",
                  allow_host="start `runledger-sync dashboard` with --allowed-host NAME for each name it is reached by")
    try:
        allowed_hosts = AllowedHosts.of(args.allowed_hosts, bound_to=args.host)
    except rl.ConfigError as error:
        error.hint = "give --allowed-host a host name such as ops.example.com, once per name"  # type: ignore[attr-defined]
        raise
    return Dashboard(engine, read_only=not args.allow_actions, authorize=allow_anyone,
                     organization_id=args.organization_id, secret=None, setup=setup, allowed_hosts=allowed_hosts)


def _listen(args: argparse.Namespace, app: Any) -> Any:
    try:
        return make_server(args.host, args.port, _named_server(app), server_class=_ThreadingServer,
                           handler_class=_QuietHandler)
    except OSError as error:  # the port is taken, or the host is not an address of this machine
        refused = rl.ConfigError([f"--port {args.port} cannot be served on {args.host!r}: {error.strerror or error}"])
        refused.hint = "pick a free --port (0 picks one) or another --host"  # type: ignore[attr-defined]
        raise refused from error


@command("dashboard", help="serve the operator dashboard over HTTP until SIGINT/SIGTERM",
         arguments=_dashboard_arguments)
def _dashboard(args: argparse.Namespace) -> int:
    rl.configure_logging_unless_configured()
    with open_engine(args) as engine:
        with _listen(args, _create_app(engine, args)) as server:
            host, port = server.server_address[:2]
            mode = "actions enabled" if args.allow_actions else "read-only"
            print(f"serving the dashboard on http://{host}:{port}/ ({mode}, no login: everyone who can reach "
                  "this address); Ctrl-C stops", flush=True)
            # shutdown() waits for serve_forever() to return, so it runs off the main thread.
            signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                pass
    return EXIT_OK
