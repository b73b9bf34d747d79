"""Process commands: ``worker`` (a supervisor until SIGINT/SIGTERM) and ``demo``."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from typing import Any

import runledger_sync as rl
from runledger_sync.cli._core import command, open_engine
from runledger_sync.demo import run_demo


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app", required=True, metavar="MODULE:NAME",
                        help="where your JobRegistry lives, e.g. myapp.jobs:registry (a callable returning one works too)")
    parser.add_argument("--concurrency", type=int, dest="max_global_concurrency", default=argparse.SUPPRESS,
                        help="most jobs running at once (max_global_concurrency)")
    parser.add_argument("--types", dest="job_types", default=argparse.SUPPRESS, metavar="A,B",
                        help="only run these registered job types")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds in-flight jobs get to finish after SIGINT/SIGTERM (default 30)")
    for field in dataclasses.fields(rl.JobsConfig):
        if field.name in ("max_global_concurrency", "job_types"):
            continue
        parser.add_argument(f"--{field.name.replace('_', '-')}", dest=field.name, default=argparse.SUPPRESS,
                            metavar="VALUE", help=f"JobsConfig.{field.name} (default: $RUNLEDGER_{field.name.upper()})")


def _load_registry(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise rl.ConfigError([f"--app must look like module:registry, got {spec!r}"])
    sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise rl.ConfigError([f"--app module {module_name!r} could not be imported: {exc}"]) from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise rl.ConfigError([f"--app {spec!r}: {module_name!r} has no attribute {attribute!r}"])
        target = getattr(target, part)
    if callable(target) and not isinstance(target, rl.JobRegistry):
        target = target()
    if not isinstance(target, rl.JobRegistry):
        raise rl.ConfigError([f"--app {spec!r} must name a JobRegistry, got {type(target).__name__}"])
    return target


def _worker_config(args: argparse.Namespace) -> Any:
    """JobsConfig from the environment, overridden by the options given; validated, never clamped.

    The environment is clamped as the spec says, but a value typed on the
    command line is taken as meant, so a bad one is reported rather than bent.
    """
    overrides = {
        field.name: _coerce(field, getattr(args, field.name))
        for field in dataclasses.fields(rl.JobsConfig)
        if hasattr(args, field.name)
    }
    return rl.JobsConfig.from_env().with_overrides(**overrides).validate()


def _coerce(field: dataclasses.Field, raw: Any) -> Any:
    kind = str(field.type)
    option = f"--{field.name.replace('_', '-')}"
    text = str(raw).strip()
    try:
        if "bool" in kind:
            if text.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes", "on")
        if "tuple" in kind:
            return tuple(part.strip() for part in text.split(","))
        if kind == "int":
            return int(text)
        if "float" in kind:
            return float(text)
    except ValueError:
        raise rl.ConfigError([f"{option} must be a {kind.replace('Optional[', '').rstrip(']')}, got {text!r}"]) from None
    return text


@command("worker", help="run a worker and reaper until SIGINT/SIGTERM", arguments=_worker_arguments)
def _worker(args: argparse.Namespace) -> int:
    registry = _load_registry(args.app)
    config = _worker_config(args)
    if not args.debug:
        rl.configure_logging(level="INFO")
    with open_engine(args) as engine:
        rl.check_schema(engine)
        registry.sync_definitions(engine)
        return rl.Supervisor(engine, registry, config).run_until_shutdown(drain_timeout=args.drain_timeout)


@command("demo", help="run the demo: an embedded PostgreSQL (unless a URL is given) and a real worker")
def _demo(args: argparse.Namespace) -> int:
    return run_demo(args.database_url or os.environ.get("RUNLEDGER_DATABASE_URL") or None)
