"""What a failed attempt keeps of its exception: the type name, the traceback, the cut and the message rules."""

from __future__ import annotations

import sys
import types

import pytest

from runledger_sync.core.evidence import (
    CALLED_BY_HEADING,
    MAX_ERROR_TYPE_CHARS,
    MAX_TRACEBACK_CHARS,
    bounded_error_type,
    cut_in_the_middle,
    error_type_of,
    evidence_of,
    format_traceback,
    message_of,
    stored_type_name,
    traceback_parts,
)
from runledger_sync.core.types import JobFailure
from runledger_sync.handlers import FunctionHandler, run_execute

SECRET = "payload-secret-5f1e9c"


def raised(fn, *args):
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - the test wants whatever it raised
        return exc
    raise AssertionError("nothing was raised")


def read_field(payload):
    def lookup_field(record):
        token = record["token"]  # a local holding the secret, which must never be shown
        return record["missing_field"] + token

    return lookup_field(payload)


class Declined(Exception):
    pass


def called_by_the_library(fn):
    """What ``fn()`` raises when runledger_sync calls it as it calls a handler.

    The traceback starts in runledger_sync, as the worker's does: the frame of
    :func:`raised`, which caught it here, is dropped.
    """
    handler = FunctionHandler("evidence.job", lambda ctx, payload: fn(), None)
    exc = raised(run_execute, handler, None, {})
    return exc.with_traceback(exc.__traceback__.tb_next)


def first_frames(tb, count):
    """A traceback of the first ``count`` entries of ``tb`` only."""
    entries = []
    while tb is not None and len(entries) < count:
        entries.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(entries):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def test_a_builtin_is_named_alone_and_any_other_type_with_its_module():
    assert error_type_of(KeyError("x")) == "KeyError"
    assert error_type_of(Declined()) == f"{__name__}.Declined"

    class Local(Exception):
        pass

    assert error_type_of(Local()) == f"{__name__}.test_a_builtin_is_named_alone_and_any_other_type_with_its_module.<locals>.Local"


def test_the_traceback_names_each_function_and_never_a_locals_value():
    evidence = evidence_of(raised(read_field, {"token": SECRET}))

    assert evidence.error_type == "KeyError"
    assert "in read_field" in evidence.traceback and "in lookup_field" in evidence.traceback
    assert evidence.traceback.endswith("KeyError: 'missing_field'\n")
    assert SECRET not in evidence.traceback
    assert isinstance(evidence.exception, KeyError)


def test_a_job_failure_raised_from_a_cause_is_known_by_the_causes_type_and_shows_both():
    def fail():
        try:
            read_field({"token": SECRET})
        except KeyError as error:
            raise JobFailure.terminal("order.incomplete", "the order has no field") from error

    evidence = evidence_of(raised(fail))

    assert evidence.error_type == "KeyError"
    assert "The above exception was the direct cause of the following exception" in evidence.traceback
    assert "in lookup_field" in evidence.traceback
    assert "runledger_sync.core.types.JobFailure: TERMINAL order.incomplete: the order has no field" in evidence.traceback


def test_a_job_failure_raised_while_handling_another_is_known_by_that_one():
    def fail():
        try:
            {}["x"]
        except KeyError:
            raise JobFailure.retryable("a.b", "c")  # noqa: B904 - the context is the point

    assert evidence_of(raised(fail)).error_type == "KeyError"
    assert "During handling of the above exception" in evidence_of(raised(fail)).traceback


def test_a_job_failure_without_a_cause_is_known_by_its_own_type():
    def fail():
        try:
            {}["x"]
        except KeyError:
            raise JobFailure.retryable("a.b", "c") from None

    assert evidence_of(raised(fail)).error_type == "runledger_sync.core.types.JobFailure"
    assert "KeyError" not in evidence_of(raised(fail)).traceback


def test_a_deep_recursion_is_cut_in_the_middle_keeping_where_it_started_and_where_it_failed():
    def ping(n):
        return pong(n + 1)

    def pong(n):
        return ping(n + 1)

    evidence = evidence_of(raised(ping, 0))

    assert evidence.error_type == "RecursionError"
    assert len(evidence.traceback) <= MAX_TRACEBACK_CHARS
    head, marker, tail = evidence.traceback.partition(" characters cut ...]\n")
    assert marker and head.startswith("Traceback (most recent call last):\n")
    assert "in raised" in head.split("[...")[0]
    assert tail.endswith("RecursionError: maximum recursion depth exceeded\n")
    assert len(format_traceback(evidence.exception)) > 5 * MAX_TRACEBACK_CHARS


@pytest.mark.parametrize("size", [MAX_TRACEBACK_CHARS + 1, 3 * MAX_TRACEBACK_CHARS, 100_000])
def test_a_cut_text_fits_the_cap_and_says_how_much_went(size):
    lines = "".join(f"line {n:06d}\n" for n in range(size // 12 + 1))[:size]

    cut = cut_in_the_middle(lines, MAX_TRACEBACK_CHARS)

    assert len(cut) <= MAX_TRACEBACK_CHARS
    head, _, rest = cut.partition("[... ")
    went = int(rest.split(" ")[0])
    tail = rest.split(" characters cut ...]\n", 1)[1]
    assert len(head) + went + len(tail) == len(lines)
    assert lines.startswith(head) and lines.endswith(tail) and head.endswith("\n")


def test_one_long_line_is_cut_too():
    cut = cut_in_the_middle("x" * 50_000, 1_000)
    assert len(cut) <= 1_000 and "characters cut" in cut


def test_text_postgresql_cannot_hold_is_made_storable_before_it_is_measured():
    evidence = evidence_of(Declined("bad\x00byte \udcff" + "\x00" * MAX_TRACEBACK_CHARS))
    assert "\x00" not in evidence.traceback and "\udcff" not in evidence.traceback
    assert len(evidence.traceback) <= MAX_TRACEBACK_CHARS


def test_a_long_type_name_keeps_its_end():
    name = "pkg." + "sub." * 200 + "Declined"
    bounded = bounded_error_type(name)
    assert len(bounded) == MAX_ERROR_TYPE_CHARS and bounded.endswith(".Declined") and bounded.startswith("...")


class FakeStatementError(Exception):
    """Stands for SQLAlchemy's error, whose message goes on with the statement and its parameters."""


FakeStatementError.__module__ = "sqlalchemy.exc"


def test_a_database_errors_message_keeps_its_first_line_only():
    error = FakeStatementError(f"(psycopg2.errors.UniqueViolation) duplicate key\nDETAIL: Key (email)=({SECRET})\n"
                               f"[SQL: INSERT ...]\n[parameters: {{'email': '{SECRET}'}}]")
    assert message_of(error) == "(psycopg2.errors.UniqueViolation) duplicate key"
    assert SECRET not in evidence_of(error).traceback
    # Any other exception's message is kept whole, as the failure message always was.
    assert message_of(Declined("two\nlines")) == "two\nlines"


def test_an_exception_that_cannot_be_printed_is_still_recorded():
    class Unprintable(Exception):
        def __str__(self):
            raise ValueError("no text for you")

    evidence = evidence_of(raised(lambda: (_ for _ in ()).throw(Unprintable())))
    assert evidence.traceback.endswith("Unprintable: unprintable Unprintable\n")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups came with Python 3.11")
def test_an_exception_groups_members_are_shown():
    group = raised(lambda: (_ for _ in ()).throw(ExceptionGroup("two failed", [Declined("one"), KeyError("k")])))  # noqa: F821
    text = evidence_of(group).traceback
    assert f"| {__name__}.Declined: one" in text and "| KeyError: 'k'" in text


def test_the_handlers_frames_come_first_and_the_library_frames_that_called_it_below_the_exception_line():
    text = evidence_of(called_by_the_library(lambda: read_field({"token": SECRET}))).traceback

    own, heading, below = text.partition(CALLED_BY_HEADING)
    assert heading
    assert own.splitlines()[:2] == ["Traceback (most recent call last):", own.splitlines()[1]]
    assert own.splitlines()[1].startswith(f'  File "{__file__}", line ')
    assert "in read_field" in own and "in lookup_field" in own and "handlers.py" not in own
    assert own.endswith("KeyError: 'missing_field'\n\n")
    assert '/runledger_sync/handlers.py", line ' in below and "in run_execute" in below and "in execute" in below
    assert __file__ not in below and SECRET not in text


def test_a_traceback_of_library_frames_only_keeps_its_order():
    exc = called_by_the_library(lambda: read_field({}))
    exc.with_traceback(first_frames(exc.__traceback__, 2))

    text = format_traceback(exc)

    assert CALLED_BY_HEADING not in text
    assert text.splitlines()[1].endswith("in run_execute") and text.endswith("KeyError: 'token'\n")


def test_a_cause_raised_in_the_handler_keeps_its_frames_and_only_the_last_exception_has_library_frames_below():
    def fail():
        try:
            read_field({"token": SECRET})
        except KeyError as error:
            raise JobFailure.terminal("order.incomplete", "the order has no field") from error

    text = format_traceback(called_by_the_library(fail))

    cause, _, failure = text.partition("The above exception was the direct cause of the following exception")
    assert CALLED_BY_HEADING not in cause and "in lookup_field" in cause
    own, _, below = failure.partition(CALLED_BY_HEADING)
    assert "in fail" in own and own.endswith("the order has no field\n\n")
    assert "in run_execute" in below


def test_the_page_reads_a_stored_traceback_back_as_the_handlers_part_and_the_library_part():
    text = format_traceback(called_by_the_library(lambda: read_field({"token": SECRET})))

    parts = traceback_parts(text)

    assert [part.called_by for part in parts] == [False, True]
    assert parts[0].text.startswith("Traceback (most recent call last):\n") and parts[0].text.endswith("'missing_field'\n")
    assert parts[1].text.startswith("  File ") and "in run_execute" in parts[1].text
    assert traceback_parts("Traceback (most recent call last):\nKeyError: 'x'\n") == [
        (("Traceback (most recent call last):\nKeyError: 'x'\n"), False)]


@pytest.mark.parametrize(("given", "stored"), [
    ("builtins.KeyError", "KeyError"),
    ("KeyError", "KeyError"),
    ("myapp.billing.Declined", "myapp.billing.Declined"),
    ("builtins", "builtins"),
    ("mybuiltins.KeyError", "mybuiltins.KeyError"),
])
def test_a_builtins_type_name_is_spelled_as_it_is_stored(given, stored):
    assert stored_type_name(given) == stored
