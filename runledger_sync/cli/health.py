"""``health``: exit 0 when healthy and 1 when not, for container probes.

Run as its own process, it cannot see a worker's threads, so it checks what
every worker needs: the database answers and its schema is at this version's
head (a readiness question). With ``--url`` it asks a running worker instead,
on its ``--metrics-port``: ``/livez`` (or its alias ``/health``) for liveness,
the worker's loops alone, or ``/readyz`` for readiness, the loops and the
database. The worker's HTTP status decides: 200 is healthy.
"""

from __future__ import annotations

import argparse
import json
import math
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_FAILED, EXIT_OK, command, first_line, pool_mode_of, redact

DEFAULT_TIMEOUT_SECONDS = 5.0


def _health_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", metavar="URL",
                        help="ask a running worker instead: its metrics port's liveness "
                             "(http://127.0.0.1:9100/livez, alias /health) or readiness (/readyz)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, metavar="SECONDS",
                        help=f"give up on a connection after this long (default {DEFAULT_TIMEOUT_SECONDS:g})")


@command("health", help="exit 0 if the database answers and its schema is at head (or, with --url, a worker's "
                        "/livez or /readyz answers 200), else 1; prints one JSON line", arguments=_health_arguments)
def _health(args: argparse.Namespace) -> int:
    report = _ask_worker(args.url, args.timeout) if args.url else _check_database(args)
    print(json.dumps(report, sort_keys=True))
    return EXIT_OK if report["healthy"] else EXIT_FAILED


def _check_database(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"healthy": False, "database_reachable": False, "schema_at_head": False}
    # Any failure is an unhealthy answer (exit 1), never a usage error: a probe
    # given a URL it cannot use is as unhealthy as one whose server is down.
    try:
        engine = rl.create_engine(args.database_url, schema=args.schema, pool_mode=pool_mode_of(args),
                                  connect_args={"connect_timeout": max(1, math.ceil(args.timeout))})
    except rl.RunledgerError as error:
        return report | {"error": _said(error, args)}
    try:
        rl.current_revision(engine)
        report["database_reachable"] = True
        rl.check_schema(engine)
        report["schema_at_head"] = True
    except Exception as error:  # noqa: BLE001 - the probe's answer: reported, exit 1
        return report | {"error": _said(error, args)}
    finally:
        engine.dispose()
    return report | {"healthy": True}


def _ask_worker(url: str, timeout: float) -> dict[str, Any]:
    if urlsplit(url).scheme not in ("http", "https"):
        return {"healthy": False, "error": f"--url must be an http:// or https:// URL, got {url!r}"}
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - scheme checked above
            answer = json.loads(response.read() or b"{}")
            return {"healthy": response.status == 200, "worker": answer}
    except urllib.error.HTTPError as error:  # 503: the worker answered, unhealthy
        try:
            answer = json.loads(error.read() or b"{}")
        except ValueError:
            answer = None
        return {"healthy": False, "status": error.code, "worker": answer}
    except (OSError, ValueError) as error:
        return {"healthy": False, "error": f"{type(error).__name__}: {error}"}


def _said(error: BaseException, args: argparse.Namespace) -> str:
    text = str(error) if isinstance(error, rl.RunledgerError) else f"{type(error).__name__}: {error}"
    return redact(first_line(text), args.database_url)
