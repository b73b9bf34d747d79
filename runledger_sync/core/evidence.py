"""What a failed attempt keeps of the exception that ended it: its type and a bounded traceback (spec section 15).

The pool thread that decides a failure turns the handler's exception into
:class:`FailureEvidence` (:func:`evidence_of`) before anything is written; the
failure's write stores it with the attempt row (``job_attempts.error_type`` and
``.traceback``) in the same statement.

What is kept:

- ``error_type``: the exception's qualified class name, ``module.QualName``
  (``myapp.billing.CardDeclined``); a builtin's goes without its module
  (``KeyError``). A :class:`~runledger_sync.core.types.JobFailure` the handler
  raised on purpose names its cause instead, when it has one (``raise
  JobFailure.retryable(...) from err``, or one raised while handling ``err``):
  that is what went wrong, and the failure's code already says what the
  handler made of it. Without a cause it is
  ``runledger_sync.core.types.JobFailure``.
- ``traceback``: what Python prints for the exception and the exceptions it was
  raised from or while handling: each frame's file, line, function and source
  line, then the exception's message. Never a frame's local values. The frames
  of runledger_sync that called the handler (the worker's, the middleware's)
  come after the exception's message, under :data:`CALLED_BY_HEADING`: the
  first frame a reader sees is the handler's own, where the dashboard shows it
  above the fold (:func:`traceback_parts` reads the two apart again). Above
  :data:`MAX_TRACEBACK_CHARS` it is cut in the middle: the first frames (where
  the handler started) and the last ones (where it failed, the message, and the
  few frames that called the handler) stay, with a line saying how many
  characters went.

Payload values stay out as they always have: a message is the handler's own
text, kept as the job's ``last_error_message`` keeps it, except a database
error's (SQLAlchemy's, the drivers', Django's), of which only the first line is
kept: the lines after it repeat the statement's parameters or the row's values
(the server's ``DETAIL``), which more often than not come from the payload.

A timeout, a lost lease and the failures the worker makes itself (no handler,
an invalid result) come from no exception: both are None.
"""

from __future__ import annotations

import builtins
import os
import traceback
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from runledger_sync.core.escapes import escape_controls
from runledger_sync.core.types import JobFailure
from runledger_sync.core.validation import storable_text

#: The longest traceback stored, in characters (``job_attempts.traceback`` checks it).
MAX_TRACEBACK_CHARS = 8192
#: The longest exception type name stored (``job_attempts.error_type`` checks it).
MAX_ERROR_TYPE_CHARS = 255
#: Written where a traceback was cut (it ends its line).
CUT_MARKER = "[... {cut} characters cut ...]\n"
#: The modules whose exceptions repeat values after their first line.
_DATABASE_MODULES = ("sqlalchemy", "psycopg2", "psycopg", "django.db")
#: Exception group members shown, as Python's own traceback shows them.
_MAX_GROUP_MEMBERS = 15
#: Exception groups, from Python 3.11 on (None before).
_EXCEPTION_GROUP: Optional[type] = getattr(builtins, "BaseExceptionGroup", None)
#: The line above the runledger_sync frames that called the handler, moved below its exception's message.
CALLED_BY_HEADING = "Called by runledger_sync (most recent call last):\n"
#: Frames from files under this directory are runledger_sync's own.
_LIBRARY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_BUILTINS_PREFIX = "builtins."
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


@dataclass(frozen=True)
class FailureEvidence:
    """A failed attempt's exception: its type name and traceback as stored, and the exception itself."""

    error_type: Optional[str] = None
    traceback: Optional[str] = None
    #: The live exception, for the hooks and the observer in this process; never stored.
    exception: Optional[BaseException] = field(default=None, compare=False, repr=False)


#: The evidence of a failure no exception caused (a timeout, an invalid result).
NO_EVIDENCE = FailureEvidence()


def evidence_of(exc: BaseException) -> FailureEvidence:
    """The type name and bounded traceback of ``exc``, as the attempt row stores them."""
    return FailureEvidence(bounded_error_type(error_type_of(exc)), bounded_traceback(format_traceback(exc)), exc)


def error_type_of(exc: BaseException) -> str:
    """The type name a failure caused by ``exc`` is known by: its own, or a raised JobFailure's cause's."""
    named = exc
    if isinstance(exc, JobFailure):
        named = cause_of(exc) or exc
    return type_name(type(named))


def type_name(cls: type) -> str:
    """``module.QualName`` of an exception class; a builtin's qualified name alone."""
    qualname = getattr(cls, "__qualname__", cls.__name__)
    module = getattr(cls, "__module__", None)
    if not isinstance(module, str) or module == "builtins":
        return qualname
    return f"{module}.{qualname}"


def stored_type_name(name: str) -> str:
    """``name`` spelled as :func:`type_name` stores it: ``builtins.KeyError`` is ``KeyError``.

    Every filter on the error type goes through it: ``builtins.KeyError``, spelled
    as ``module.QualName`` reads for any other class, finds the failures stored
    as ``KeyError``.
    """
    if name.startswith(_BUILTINS_PREFIX) and len(name) > len(_BUILTINS_PREFIX):
        return name[len(_BUILTINS_PREFIX):]
    return name


def cause_of(exc: BaseException) -> Optional[BaseException]:
    """The exception ``exc`` was raised from or while handling, as Python's traceback follows it."""
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__


def message_of(exc: BaseException) -> str:
    """The text of ``exc`` as a failure message keeps it (see the module docstring)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the failure
        return f"unprintable {type(exc).__name__}"
    if _from_a_database(type(exc)):
        return (text.strip().splitlines() or [""])[0]
    return text


def format_traceback(exc: BaseException, *, escaped_messages: bool = False) -> str:
    """What Python prints for ``exc``, its cause and context, without locals, messages as :func:`message_of` gives them.

    Each exception's leading runledger_sync frames (the worker's, that called
    the handler) follow its message under :data:`CALLED_BY_HEADING`, so its
    first frame is the user's. The worker's record of a failure, the log
    formatter and the dashboard (through :func:`traceback_parts`) all read this text.

    With ``escaped_messages`` each exception's type, message and notes have their
    control characters escaped (:func:`~runledger_sync.core.escapes.escape_controls`),
    so every line break left is the traceback's own: a log shows one line per line
    of it, and a message cannot start a line of its own.
    """
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = cause_of(current)
    parts: list[str] = []
    for index, one in enumerate(reversed(chain)):  # oldest first, as Python prints them
        if index:
            parts.append(_CAUSE if one.__cause__ is not None else _CONTEXT)
        parts.append(_format_one(one, seen, escaped_messages))
    return "".join(parts)


def _format_one(exc: BaseException, seen: set[int], escaped_messages: bool) -> str:
    shown = escape_controls if escaped_messages else _as_given
    lines = []
    called_by: list[traceback.FrameSummary] = []
    if exc.__traceback__ is not None:
        frames = traceback.extract_tb(exc.__traceback__)
        called_by, own = _split_callers(frames)
        lines.append("Traceback (most recent call last):\n")
        lines.extend(traceback.StackSummary.from_list(own).format())
    message = message_of(exc)
    header = f"{type_name(type(exc))}: {message}" if message else type_name(type(exc))
    lines.append(f"{shown(header)}\n")
    if not _from_a_database(type(exc)):
        lines.extend(f"{shown(note)}\n" for note in getattr(exc, "__notes__", None) or () if isinstance(note, str))
    if _EXCEPTION_GROUP is not None and isinstance(exc, _EXCEPTION_GROUP):
        members: tuple[BaseException, ...] = getattr(exc, "exceptions", ())
        for number, member in enumerate(members[:_MAX_GROUP_MEMBERS], start=1):
            if id(member) in seen:
                continue
            seen.add(id(member))
            lines.append(f"+---------------- {number} ----------------\n")
            member_text = format_traceback(member, escaped_messages=escaped_messages)
            lines.extend(f"| {line}\n" for line in member_text.splitlines())
        if len(members) > _MAX_GROUP_MEMBERS:
            lines.append(f"+---------------- ... ----------------\nand {len(members) - _MAX_GROUP_MEMBERS} "
                         "more exceptions\n")
    if called_by:
        lines.append(f"\n{CALLED_BY_HEADING}")
        lines.extend(traceback.StackSummary.from_list(called_by).format())
    return "".join(lines)


def _split_callers(frames: traceback.StackSummary) -> tuple[list[traceback.FrameSummary], list[traceback.FrameSummary]]:
    """The leading runledger_sync frames and the rest, from the first frame of the user's code on.

    A traceback with no frame of the user's keeps its order: nothing would come first instead.
    """
    first_own = next((index for index, frame in enumerate(frames) if not _in_the_library(frame.filename)), 0)
    return list(frames[:first_own]), list(frames[first_own:])


def _in_the_library(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_LIBRARY_ROOT)


class TracebackPart(NamedTuple):
    """A stretch of a stored traceback: the exception's own frames and message, or the frames that called the handler."""

    text: str
    #: True for frames listed under :data:`CALLED_BY_HEADING` (the heading itself left out).
    called_by: bool


def traceback_parts(text: str) -> list[TracebackPart]:
    """``text``, a stored traceback, cut into the parts :func:`format_traceback` wrote, in order.

    The page shows the handler's parts and folds the ``called_by`` ones. A
    traceback stored before these were moved, or cut through the heading, is one
    part, or a part without the frames that were cut.
    """
    parts: list[TracebackPart] = []
    current: list[str] = []
    called_by = False
    for line in text.splitlines(keepends=True):
        heading = line == CALLED_BY_HEADING
        if heading or (called_by and not line.startswith(" ")):
            if heading and current and current[-1] == "\n":
                current.pop()  # the blank line only separates the two in plain text
            if current:
                parts.append(TracebackPart("".join(current), called_by))
            current, called_by = [], heading
        if not heading:
            current.append(line)
    if current:
        parts.append(TracebackPart("".join(current), called_by))
    return parts


def _as_given(text: str) -> str:
    return text


def _from_a_database(cls: type) -> bool:
    module = getattr(cls, "__module__", None)
    return isinstance(module, str) and any(module == root or module.startswith(f"{root}.") for root in _DATABASE_MODULES)


def bounded_traceback(text: str, max_chars: int = MAX_TRACEBACK_CHARS) -> str:
    """``text`` as PostgreSQL text holds it, cut in the middle to at most ``max_chars`` characters."""
    return cut_in_the_middle(storable_text(text), max_chars)


def bounded_error_type(name: str) -> str:
    """A type name as stored: its end (the class's own name) kept when it is too long."""
    name = storable_text(name)
    if len(name) <= MAX_ERROR_TYPE_CHARS:
        return name
    return "..." + name[len(name) - MAX_ERROR_TYPE_CHARS + 3:]


def cut_in_the_middle(text: str, max_chars: int) -> str:
    """``text`` if it fits, else its first and last whole lines around :data:`CUT_MARKER`, within ``max_chars``."""
    if len(text) <= max_chars:
        return text
    # Room for the marker, and for a newline before it when the head ends mid-line.
    room = max_chars - len(CUT_MARKER.format(cut=len(text))) - 1
    # The end says where it failed and why: it gets the larger share.
    head, tail = text[:room // 3], text[len(text) - (room - room // 3):]
    if "\n" in head:
        head = head[:head.rfind("\n") + 1]
    start = tail.find("\n")
    if 0 <= start < len(tail) - 1:
        tail = tail[start + 1:]
    joint = "" if not head or head.endswith("\n") else "\n"
    return head + joint + CUT_MARKER.format(cut=len(text) - len(head) - len(tail)) + tail
