"""Workflow commands: ``workflows list | show | cancel | complete-external``."""

from __future__ import annotations

import argparse
import json
from typing import Any, Iterator, Mapping
from uuid import UUID

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, PROG, command, command_group, open_engine
from runledger_sync.cli._output import add_json_option, print_json, print_table, printable, when
from runledger_sync.cli.jobs import parse_json_argument

command_group("workflows", help="list and show workflow runs, cancel one, answer an external step")

RUN_TABLE_COLUMNS = ("id", "name", "status", "organization", "created", "finished", "reason")
STEP_TABLE_COLUMNS = ("step", "kind", "status", "job", "error", "note")
MUTATION_TABLE_COLUMNS = ("append", "window", "steps", "created")


def _parse_run_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        error = rl.InvalidArgument("RUN_ID", text, "a workflow run id (a UUID such as 0190c6c2-5f1e-7000-8000-000000000000)")
        error.hint = f"copy the id from `{PROG} workflows list`"  # type: ignore[attr-defined]
        raise error from None


def _add_run_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN_ID", help="the workflow run's id (a UUID)")


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", type=str.upper, choices=[status.value for status in rl.WorkflowRunStatus])
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="only this organization's runs")
    parser.add_argument("--limit", type=int, default=100, metavar="N", help="most rows to print (default 100)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run (JSON lines)")


@command("workflows list", help="list workflow runs, newest first", arguments=_list_arguments)
def _workflows_list(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        runs = rl.list_workflow_runs(engine, status=args.status, organization_id=args.organization_id, limit=args.limit)
    if args.json:
        for run in runs:
            print_json(run)
        return EXIT_OK
    print_table(RUN_TABLE_COLUMNS, [(run.id, run.name, run.status.value, run.organization_id, when(run.created_at),
                                     when(run.finished_at), run.status_reason) for run in runs])
    return EXIT_OK


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_id(parser)
    add_json_option(parser, "the run and its steps")


@command("workflows show", help="print one workflow run with its steps drawn as a tree of their dependencies",
         arguments=_show_arguments)
def _workflows_show(args: argparse.Namespace) -> int:
    run_id = _parse_run_id(args.run_id)
    with open_engine(args) as engine:
        run = rl.get_workflow_run(engine, run_id)
    if run is None:
        raise rl.WorkflowRunNotFound(f"workflow run {run_id} was not found", run_id=str(run_id))
    if args.json:
        print_json(run)
        return EXIT_OK
    for label, value in (("id", run.id), ("name", run.name), ("status", run.status.value),
                         ("organization_id", run.organization_id), ("idempotency_key", run.idempotency_key),
                         ("reason", run.status_reason), ("created", when(run.created_at)),
                         ("finished", when(run.finished_at)),
                         ("meta", json.dumps(run.meta, sort_keys=True) if run.meta else None)):
        print(f"{label + ':':<17} {printable(value)}")
    appended_by = {key: mutation.mutation_key for mutation in run.mutations for key in mutation.step_keys}
    print(f"\nsteps ({len(run.steps)}):")
    print_table(STEP_TABLE_COLUMNS, step_tree_rows(run.steps, appended_by))
    if run.mutations:
        print(f"\nappends ({len(run.mutations)}):")
        print_table(MUTATION_TABLE_COLUMNS, [
            (mutation.mutation_key, mutation.window, _shown_keys(mutation.step_keys), when(mutation.created_at))
            for mutation in run.mutations])
    return EXIT_OK


#: How many of an append's step keys its row names before it gives only their number.
KEYS_SHOWN = 5


def _shown_keys(keys: tuple[str, ...]) -> str:
    if len(keys) <= KEYS_SHOWN:
        return ", ".join(keys)
    return f"{', '.join(keys[:KEYS_SHOWN])}, ... ({len(keys)} steps)"


#: Deeper steps are not indented further but labelled with their depth, so a chain
#: of thousands of steps stays as wide as a shallow one.
MAX_DRAWN_DEPTH = 12


def step_tree_rows(steps: tuple[Any, ...], appended_by: Mapping[str, str]) -> list[tuple[Any, ...]]:
    """One table row per step, its key indented under the step it hangs from.

    A step hangs from its last prerequisite in the run's step order; the others it
    waits for are named in its note, so a fan-in step is drawn once. ``appended_by``
    names the append that added a step, for its note.
    """
    order = {step.key: index for index, step in enumerate(steps)}
    parent = {step.key: max(step.deps, key=order.__getitem__) for step in steps if step.deps}
    children: dict[str | None, list[Any]] = {}
    for step in steps:
        children.setdefault(parent.get(step.key), []).append(step)
    return [_step_row(step, prefix, parent.get(step.key), appended_by.get(step.key)) for step, prefix in _walk(children)]


def _walk(children: dict[str | None, list[Any]]) -> Iterator[tuple[Any, str]]:
    """Each step with its drawn prefix, depth first, with a stack rather than recursion (chains run deep)."""
    roots = children.get(None, [])
    stack: list[tuple[Iterator[tuple[int, Any]], int, str, int]] = [(enumerate(roots), len(roots), "", 0)]
    while stack:
        below, count, indent, depth = stack[-1]
        entry = next(below, None)
        if entry is None:
            stack.pop()
            continue
        index, step = entry
        branch, extend = ("", "") if depth == 0 else (("`-- ", "    ") if index == count - 1 else ("|-- ", "|   "))
        yield step, (f"[depth {depth}] " if depth > MAX_DRAWN_DEPTH else indent) + branch
        under = children.get(step.key, [])
        if under:
            stack.append((enumerate(under), len(under), indent + extend if depth <= MAX_DRAWN_DEPTH else indent,
                          depth + 1))


def _step_row(step: Any, prefix: str, parent_key: str | None, appended_by: str | None) -> tuple[Any, ...]:
    notes = [] if appended_by is None else [f"appended ({appended_by})"]
    others = [key for key in step.deps if key != parent_key]
    if others:
        notes.append("also after " + ", ".join(others))
    if step.deps and step.release is rl.WorkflowReleaseMode.ON_SUCCESS:
        notes.append("only on success")
    # printable() escapes the key here, so the drawn prefix stays as drawn.
    return (prefix + printable(step.key), step.kind.value, step.status.value, step.job_id, step.error_code,
            "; ".join(notes) or None)


def _cancel_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_id(parser)
    parser.add_argument("--reason", help="recorded on the run, its cancelled steps and their jobs (default CANCELED)")


@command("workflows cancel", help="cancel a run: its steps not yet started and their pending jobs",
         arguments=_cancel_arguments)
def _workflows_cancel(args: argparse.Namespace) -> int:
    run_id = _parse_run_id(args.run_id)
    with open_engine(args) as engine:
        run = rl.cancel_workflow_run(engine, run_id, reason=args.reason)
    running = [step.key for step in run.steps if step.status is rl.WorkflowStepStatus.RUNNING]
    print(f"workflow run {run.id} canceled: {printable(run.status_reason)}")
    if running:
        print(f"still running, to their end: {printable(', '.join(running))}")
    return EXIT_OK


def _complete_external_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_id(parser)
    parser.add_argument("step_key", metavar="STEP", help="the external step's key")
    answer = parser.add_mutually_exclusive_group(required=True)
    answer.add_argument("--succeeded", dest="succeeded", action="store_const", const=True,
                        help="the step succeeded: its dependents move on")
    answer.add_argument("--failed", dest="succeeded", action="store_const", const=False,
                        help="the step failed: dependents released only on success are cancelled")
    parser.add_argument("--output", metavar="JSON",
                        help="with --succeeded, the step's output as one JSON value; its dependents read it")


#: The hint for an --output refused as JSON, or as JSON that jsonb would not keep as given.
OUTPUT_HINT = """pass the output as one JSON value quoted for your shell, e.g. '{"by": "ada"}'"""


@command("workflows complete-external", help="answer an external step that waits, as succeeded or failed",
         arguments=_complete_external_arguments)
def _workflows_complete_external(args: argparse.Namespace) -> int:
    run_id = _parse_run_id(args.run_id)
    try:
        output = None if args.output is None else parse_json_argument(args.output, "--output")
        with open_engine(args) as engine:
            run = rl.complete_external_step(engine, run_id, args.step_key, succeeded=args.succeeded, output=output,
                                            max_output_bytes=rl.JobsConfig.from_env().max_output_bytes)
    except rl.OutputTooLarge:
        raise
    except rl.InvalidPayload as error:  # only the output is JSON here
        error.hint = OUTPUT_HINT  # type: ignore[attr-defined]
        raise
    step = run.step(args.step_key)
    print(f"step {printable(step.key)} {step.status.value}; workflow run {run.id} {run.status.value}")
    return EXIT_OK
