"""Process commands: ``worker`` (a supervisor until SIGINT/SIGTERM) and ``demo``."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from typing import Any

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, PROG, command, load_app_registry, open_engine, refused_input
from runledger_sync.demo import run_demo
from runledger_sync.logging import LOG_FORMAT_VARIABLE, LOG_FORMATS, resolve_log_format


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app", required=True, metavar="MODULE:NAME",
                        help="where your JobRegistry lives, e.g. myapp.jobs:registry (a callable returning one works too)")
    parser.add_argument("--concurrency", type=int, dest="max_global_concurrency", default=argparse.SUPPRESS,
                        help="most jobs running at once (max_global_concurrency)")
    parser.add_argument("--types", dest="job_types", default=argparse.SUPPRESS, metavar="A,B",
                        help="only run these registered job types")
    parser.add_argument("--queues", dest="queues", default=argparse.SUPPRESS, metavar="A,B",
                        help="only claim jobs of these queues (default: $RUNLEDGER_QUEUES, else every queue); "
                             "each must exist (`queues list`) or be declared or used by --app")
    parser.add_argument("--queue-concurrency", dest="queue_concurrency", default=argparse.SUPPRESS,
                        metavar="QUEUE=N,...",
                        help="most jobs of a queue this worker runs at once, inside --concurrency, e.g. "
                             "mail=2,default=8 (default: $RUNLEDGER_QUEUE_CONCURRENCY, else no cap)")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds in-flight jobs get to finish after SIGINT/SIGTERM (default 30)")
    parser.add_argument("--wait-for-database", dest="wait_for_database", type=_seconds, default=None,
                        metavar="SECONDS",
                        help="at start, wait this long for the database to answer, trying again every 2 s at most "
                             "and logging every 5 s (default: for ever; 0: exit at once, db.wait_timeout)")
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="worker processes, each with its own --concurrency threads, for CPU-bound handlers; "
                             "a parent restarts one that dies and drains all on SIGINT/SIGTERM (default 1)")
    parser.add_argument("--no-scheduler", dest="run_scheduler", action="store_false",
                        help="do not fire cron schedules in this process (another process does)")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics, liveness at /livez (alias "
                             "/health: the loops) and readiness at /readyz (the loops and the database); needs the "
                             "metrics extra; 0 picks a free port, logged at start; with --processes N it serves "
                             "every process's counters, summed")
    parser.add_argument("--metrics-host", default=None, metavar="HOST",
                        help="the address the metrics port listens on (default 127.0.0.1; the port has no "
                             "authentication: 0.0.0.0 serves every interface)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                        help="text: readable lines, one per finished job; json: one JSON object per line and a "
                             f"summary a minute (default: ${LOG_FORMAT_VARIABLE}, else text when stderr is a "
                             "terminal and json otherwise)")
    parser.add_argument("--strict-config", action="store_true",
                        help="exit 2 listing every RUNLEDGER_*/JOBS_* value that does not parse or is out of "
                             "range, instead of using the default or the nearest allowed value")
    for field in dataclasses.fields(rl.JobsConfig):
        if field.name in ("max_global_concurrency", "job_types", "queues", "queue_concurrency"):
            continue
        parser.add_argument(f"--{field.name.replace('_', '-')}", dest=field.name, default=argparse.SUPPRESS,
                            metavar="VALUE", help=f"JobsConfig.{field.name} (default: $RUNLEDGER_{field.name.upper()})")


MAX_PORT = 65535


def _seconds(text: str) -> float:
    """A number of seconds >= 0, for argparse (which reports the ValueError as a usage error)."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value
CONFIG_HINT = ("fix each value listed: worker options win over RUNLEDGER_*/JOBS_* variables; "
               "see `runledger-sync worker --help` and docs/reference/configuration.md")


def _refuse(problems: list[str], hint: str) -> Exception:
    error = rl.ConfigError(problems)
    error.hint = hint  # type: ignore[attr-defined]
    return error


def _worker_config(args: argparse.Namespace, registry: Any) -> Any:
    """JobsConfig from the environment, overridden by the options given; validated, never clamped.

    The environment is clamped as the spec says (each change is logged when the
    worker starts), unless --strict-config refuses it. A value typed on the
    command line is taken as meant, so a bad one is reported rather than bent.
    Every problem is reported at once.
    """
    overrides = {
        field.name: _coerce(field, getattr(args, field.name))
        for field in dataclasses.fields(rl.JobsConfig)
        if hasattr(args, field.name)
    }
    config = rl.JobsConfig.from_env().with_overrides(**overrides)
    problems = [adjustment.problem for adjustment in config.env_adjustments] if args.strict_config else []
    try:
        config.validate()
    except rl.ConfigError as error:
        problems.extend(error.problems)
    problems.extend(_unknown_types(config.job_types, registry, args))
    if problems:
        raise _refuse(problems, CONFIG_HINT)
    return config


def _unknown_types(job_types: Any, registry: Any, args: argparse.Namespace) -> list[str]:
    """A type the registry lacks would never be claimed; refuse it rather than run a worker that does nothing."""
    if not isinstance(job_types, tuple):
        return []  # None (every type) or a shape validate() has already reported
    unknown = [t for t in job_types if isinstance(t, str) and t.strip() and t not in registry]
    if not unknown:
        return []
    source = "--types" if hasattr(args, "job_types") else "RUNLEDGER_JOB_TYPES"
    registered = ", ".join(sorted(registry.registered_types())) or "none"
    return [f"{source} names job types not registered in --app {args.app}: {', '.join(unknown)} "
            f"(registered: {registered})"]


def _coerce(field: dataclasses.Field, raw: Any) -> Any:
    kind = str(field.type)
    option = f"--{field.name.replace('_', '-')}"
    text = str(raw).strip()
    try:
        if "Retention" in kind:
            return rl.Retention.parse(text, argument=option)
        if "bool" in kind:
            if text.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes", "on")
        if "tuple" in kind:
            return tuple(part.strip() for part in text.split(","))
        if "Mapping" in kind:
            return _queue_counts(option, text)
        if kind == "int":
            return int(text)
        if "float" in kind:
            return float(text)
    except rl.InvalidArgument as error:
        raise _refuse([error.message], CONFIG_HINT) from None
    except ValueError:
        raise _refuse([f"{option} must be a {kind.replace('Optional[', '').rstrip(']')}, got {text!r}"],
                      CONFIG_HINT) from None
    return text


def _queue_counts(option: str, text: str) -> dict[str, int]:
    """``mail=2,default=8`` as a mapping; the counts' range is left to the config's validation."""
    counts: dict[str, int] = {}
    for part in (part.strip() for part in text.split(",")):
        name, equals, count = part.partition("=")
        try:
            if not equals or not name.strip() or name.strip() in counts:
                raise ValueError(part)
            counts[name.strip()] = int(count.strip())
        except ValueError:
            raise _refuse([f"{option} must list queue=count pairs, each queue once, e.g. mail=2,default=8, "
                           f"got {text!r}"], CONFIG_HINT) from None
    return counts


def _check_queues(args: argparse.Namespace, supervisor: Any) -> None:
    """Refuse a queue that does not exist before anything is written (the sync comes after)."""
    sources = {"queues": "--queues" if hasattr(args, "queues") else "RUNLEDGER_QUEUES",
               "queue_concurrency": "--queue-concurrency" if hasattr(args, "queue_concurrency")
               else "RUNLEDGER_QUEUE_CONCURRENCY"}
    try:
        supervisor.check_queues(sources=sources)
    except rl.QueueNotFound as error:
        source = sources.get(error.details.get("setting", ""), "--queues")
        raise refused_input(error, f"fix {source}: list the queues with `{PROG} queues list`, or declare the "
                                   "queue in --app with registry.queue()") from None


@command("worker", help="run a worker, reaper and scheduler until SIGINT/SIGTERM", arguments=_worker_arguments)
def _worker(args: argparse.Namespace) -> int:
    registry = load_app_registry(args.app)
    config = _worker_config(args, registry)
    if args.metrics_port is not None and not 0 <= args.metrics_port <= MAX_PORT:
        raise _refuse([f"--metrics-port must be a port number from 0 to {MAX_PORT}, got {args.metrics_port}"],
                      "give a free TCP port, e.g. --metrics-port 9100 (0 picks one)")
    # Made before the database is touched, so a missing metrics extra is refused first.
    # With --processes N it gathers the worker processes' counts for this process's port.
    worker_metrics = _worker_metrics() if args.metrics_port is not None else None
    try:
        log_format = resolve_log_format(args.log_format)
    except rl.ConfigError as error:
        raise _refuse(error.problems, f"set {LOG_FORMAT_VARIABLE}=text or json, or give --log-format") from error
    if not args.debug:
        rl.configure_logging(level="INFO", json=log_format == "json")
    try:
        return _run_worker(args, registry, config, worker_metrics)
    finally:
        if worker_metrics is not None:
            worker_metrics.close()  # the worker processes' directory, once they are all gone


def _run_worker(args: argparse.Namespace, registry: Any, config: Any, worker_metrics: Any) -> int:
    with open_engine(args) as engine:
        # Built first: a bad --processes is refused before the database is touched.
        supervisor = rl.Supervisor(engine, registry, config, run_scheduler=args.run_scheduler,
                                   processes=args.processes, app=args.app, observer=worker_metrics)
        if not supervisor.wait_for_database(args.wait_for_database):
            return EXIT_OK  # a signal came while the database was still away
        rl.check_schema(engine)
        _check_queues(args, supervisor)
        registry.sync_definitions(engine)
        server = _serve_metrics(args, engine, worker_metrics, supervisor) if worker_metrics is not None else None
        try:
            return supervisor.run_until_shutdown(drain_timeout=args.drain_timeout,
                                                 wait_for_database_seconds=args.wait_for_database)
        finally:
            if server is not None:
                server.close()


def _worker_metrics() -> Any:
    from runledger_sync import metrics

    return metrics.WorkerMetrics()


def _serve_metrics(args: argparse.Namespace, engine: Any, observer: Any, supervisor: Any) -> Any:
    from runledger_sync import metrics

    host = args.metrics_host or metrics.DEFAULT_METRICS_HOST
    try:
        return metrics.serve_metrics(metrics.registry_for(engine, worker=observer), args.metrics_port, host=host,
                                     health=supervisor.health)
    except OSError as error:  # the port is taken, or the host is not an address of this machine
        raise _refuse([f"--metrics-port {args.metrics_port} cannot be served on {host!r}: {error.strerror or error}"],
                      "pick a free port (0 picks one) or another --metrics-host") from error


@command("demo", help="run the demo: an embedded PostgreSQL (unless a URL is given) and a real worker")
def _demo(args: argparse.Namespace) -> int:
    # The demo writes a few hundred jobs: only into a database named on its own command line,
    # never into one a shell exported for other commands.
    if args.database_url is None and os.environ.get("RUNLEDGER_DATABASE_URL"):
        print("ignoring RUNLEDGER_DATABASE_URL; pass --database-url to use it", flush=True)
    return run_demo(args.database_url)
