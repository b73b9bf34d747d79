"""``runledger-sync dashboard``: serve the operator dashboard with the standard library's WSGI server."""

from __future__ import annotations

import argparse
import signal
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import runledger_sync as rl
from runledger_sync.logging import get_logger
from runledger_sync.cli._core import EXIT_OK, command, open_engine

log = get_logger("web")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
EXTRA_HINT = "install the dashboard extra: pip install 'runledger-sync[dashboard]'"


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    # A slow page (a wide filter on a big table) must not hold up the others.
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        # One structured line per request, without the query string (it may carry search text).
        log.info("dashboard request", extra={"request_line": self.requestline.split("?", 1)[0],
                                                "status": args[1] if len(args) > 1 else None})


def _dashboard_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on, 0 for any free one (default {DEFAULT_PORT})")
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="show and act on this organization's jobs only")
    parser.add_argument("--allow-actions", action="store_true",
                        help="enable cancel, retry, replay and the schedule actions for everyone who can reach "
                             "the address (read-only without it)")


def _create_app(engine: Any, args: argparse.Namespace) -> Any:
    try:
        from runledger_sync.web import create_app
    except ImportError as exc:
        error = rl.ConfigError([f"the dashboard cannot start: {exc}"])
        error.hint = EXTRA_HINT  # type: ignore[attr-defined]
        raise error from exc
    if args.allow_actions:
        return create_app(engine, read_only=False, authorize=lambda request, action: True,
                          organization_id=args.organization_id)
    return create_app(engine, organization_id=args.organization_id)


@command("dashboard", help="serve the operator dashboard over HTTP until SIGINT/SIGTERM",
         arguments=_dashboard_arguments)
def _dashboard(args: argparse.Namespace) -> int:
    rl.configure_logging_unless_configured()
    with open_engine(args) as engine:
        app = _create_app(engine, args)
        with make_server(args.host, args.port, app, server_class=_ThreadingServer, handler_class=_QuietHandler) as server:
            host, port = server.server_address[:2]
            mode = "actions enabled" if args.allow_actions else "read-only"
            print(f"serving the dashboard on http://{host}:{port}/ ({mode}); Ctrl-C stops", flush=True)
            # shutdown() waits for serve_forever() to return, so it runs off the main thread.
            signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                pass
    return EXIT_OK
