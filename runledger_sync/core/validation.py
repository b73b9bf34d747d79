"""Argument rules checked before any statement runs, so bad input writes nothing."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any, Optional, TypeGuard

from runledger_sync.core.shapes import echo_or_shape, int_too_long, type_phrase
from runledger_sync.core.errors import (
    CheckpointTooLarge,
    InvalidArgument,
    InvalidCompletionProgress,
    InvalidJobType,
    InvalidPayload,
    InvalidProgress,
    OutputTooLarge,
)

JOB_TYPE_MAX_LENGTH = 255
ORGANIZATION_ID_MAX_LENGTH = 255
IDEMPOTENCY_KEY_MAX_LENGTH = 512
# The unique idempotency index holds job_type, organization_id and
# idempotency_key, and PostgreSQL refuses a btree index row over 2704 bytes.
# Characters are up to 4 bytes of UTF-8, so character limits alone let the row
# grow to 8 + (4 + 1020) + (4 + 1020) + (4 + 2048) bytes. With these byte limits
# the worst row is 8 (tuple header) + 4 + 1020 (job_type, 255 characters)
# + 4 + 512 + 4 + 1024 = 2576 bytes. ASCII text reaches the character limit first.
ORGANIZATION_ID_MAX_BYTES = 512
IDEMPOTENCY_KEY_MAX_BYTES = 1024
FAILURE_CODE_MAX_LENGTH = 255
WORKER_ID_MAX_LENGTH = 255
DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576
DEFAULT_MAX_OUTPUT_BYTES = 1_048_576
PRIORITY_RANGE = (-1_000_000, 1_000_000)
MAX_ATTEMPTS_RANGE = (1, 1_000)
TIMEOUT_SECONDS_RANGE = (1, 7 * 24 * 3600)
DELAY_SECONDS_RANGE = (0, 366 * 24 * 3600)
LIMIT_RANGE = (1, 100_000)
BIGINT_MAX = 2**63 - 1
# No upper bound of ours: JobsConfig.validate() accepts any positive size.
MAX_PAYLOAD_BYTES_RANGE = (1, 2**63 - 1)
MAX_OUTPUT_BYTES_RANGE = MAX_PAYLOAD_BYTES_RANGE


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_text(
    argument: str, value: Any, *, max_length: int, max_bytes: Optional[int] = None,
    error: type[InvalidArgument] = InvalidArgument,
) -> str:
    """Return ``value`` if it is non-blank text of at most ``max_length`` characters without NUL.

    ``max_bytes`` also bounds its UTF-8 size, for text an index holds: an index
    counts bytes, and a character may take four.
    """
    if not isinstance(value, str):
        raise error(argument, value, "a string")
    if not value.strip():
        raise error(argument, value, "non-blank")
    if len(value) > max_length:
        raise error(argument, f"{value[:40]}... ({len(value)} characters)", f"at most {max_length} characters")
    if "\x00" in value:
        raise error(argument, value, "free of NUL characters")
    if not _encodes_as_utf8(value):
        # Lone surrogates (what surrogateescape makes of bad bytes in argv) would
        # otherwise fail later inside the driver, as a UnicodeEncodeError.
        raise error(argument, value, "valid Unicode text (no lone surrogates)")
    if max_bytes is not None:
        size = len(value.encode("utf-8"))
        if size > max_bytes:
            raise error(argument, f"{value[:40]}... ({size} bytes of UTF-8)", f"at most {max_bytes} bytes of UTF-8")
    return value


def check_organization_id(value: Any) -> str:
    return check_text("organization_id", value, max_length=ORGANIZATION_ID_MAX_LENGTH,
                      max_bytes=ORGANIZATION_ID_MAX_BYTES)


def check_optional_organization_id(value: Any) -> Optional[str]:
    return None if value is None else check_organization_id(value)


def check_optional_idempotency_key(value: Any) -> Optional[str]:
    if value is None:
        return None
    return check_text("idempotency_key", value, max_length=IDEMPOTENCY_KEY_MAX_LENGTH,
                      max_bytes=IDEMPOTENCY_KEY_MAX_BYTES)


# Every code point PostgreSQL text cannot hold: a lone surrogate, whatever its pair.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: What a NUL becomes in stored text: the four characters of its escape, visibly.
NUL_MARKER = "\\x00"
#: What a lone surrogate becomes in stored text: the Unicode replacement character.
SURROGATE_MARKER = "\ufffd"


def storable_text(text: str) -> str:
    """Return ``text`` as PostgreSQL text can hold it, with what had to change marked.

    A NUL becomes the four characters ``\\x00`` and a lone surrogate (what
    surrogateescape makes of a badly encoded file name) becomes U+FFFD. Used
    for text the worker must record whatever it holds, such as a handler's
    failure message: refusing it would lose the failure.
    """
    if "\x00" in text:
        text = text.replace("\x00", NUL_MARKER)
    if not _encodes_as_utf8(text):
        text = _SURROGATE.sub(SURROGATE_MARKER, text)
    return text


def check_failure_code(value: Any) -> str:
    """Return a failure's code as it will be stored: non-blank text of at most 255 characters.

    NUL and lone surrogates are replaced (see :func:`storable_text`), not refused,
    so a failure whose code holds them is still recorded.
    """
    if not isinstance(value, str):
        raise InvalidArgument("failure.code", value, "a string")
    if not value.strip():
        raise InvalidArgument("failure.code", value, "non-blank")
    if len(value) > FAILURE_CODE_MAX_LENGTH:
        raise InvalidArgument("failure.code", f"a str of {len(value)} characters",
                              f"at most {FAILURE_CODE_MAX_LENGTH} characters")
    return storable_text(value)


def _encodes_as_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_job_type(value: Any) -> str:
    return check_text("job_type", value, max_length=JOB_TYPE_MAX_LENGTH, error=InvalidJobType)


def check_optional_text(argument: str, value: Any, *, max_length: int) -> Optional[str]:
    return None if value is None else check_text(argument, value, max_length=max_length)


def check_int(argument: str, value: Any, bounds: tuple[int, int]) -> int:
    """Return ``value`` if it is an int (not a bool) within ``bounds`` inclusive."""
    low, high = bounds
    if not _is_int(value) or not low <= value <= high:
        raise InvalidArgument(argument, value, f"an integer from {low} to {high}")
    return value


def check_optional_int(argument: str, value: Any, bounds: tuple[int, int]) -> Optional[int]:
    return None if value is None else check_int(argument, value, bounds)


def check_seconds(argument: str, value: Any, bounds: tuple[float, float]) -> float:
    """Return ``value`` if it is a finite number of seconds within ``bounds``."""
    low, high = bounds
    number_like = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number_like or not math.isfinite(value) or not low <= value <= high:
        raise InvalidArgument(argument, value, f"a number of seconds from {low} to {high}")
    return float(value)


def check_run_at(value: Any, argument: str = "run_at") -> Optional[datetime]:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(argument, value, "a timezone-aware datetime")
    return value


# An escaped NUL in JSON text: \u0000 after an even number of backslashes. Text
# that merely spells it (a literal backslash then "u0000") is escaped as \\u0000
# and is fine for jsonb.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


#: json.dumps builds an encoder on every call given any option; every payload is encoded with this one.
_JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def serialize_json(
    argument: str, value: Any, *, max_bytes: Optional[int] = None, too_large: type[InvalidPayload] = InvalidPayload,
) -> str:
    """Return ``value`` as compact JSON text, refusing what PostgreSQL's jsonb cannot hold.

    The error names where the refused part is and what type it has (``got a dict
    holding a set at key 's'``), never the value: ``value`` is a payload, an
    output or a checkpoint, and those may hold secrets.

    Raises:
        InvalidPayload: not JSON-serialisable, NaN/Infinity, nested too deeply, a
            NUL character (jsonb rejects ``\\u0000``) or a lone surrogate, a key
            that is not a string, an int of more than 4,300 digits, or larger
            than ``max_bytes`` encoded (raised as ``too_large``).
    """
    try:
        text = _JSON_ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        # json's own message is not used: ValueError's repeats the float it refused.
        raise InvalidPayload(argument, value, _JSON_VALUE) from exc
    # Only a container can hold a non-string key, and a bare int is checked at once.
    if isinstance(value, (dict, list, tuple, int)) and _holds_what_dumps_accepts_but_jsonb_loses(value):
        raise InvalidPayload(argument, value, _JSON_VALUE)
    # ASCII text is its own UTF-8, one byte a character, and holds no surrogate:
    # only other text is encoded, to count its bytes and find a lone surrogate.
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            # A lone surrogate: jsonb refuses it whether sent raw or as a \ud800 escape.
            raise InvalidPayload(argument, value, "valid Unicode text (no lone surrogates)") from exc
    # The substring test first: the pattern's look-behind costs ~40 ms a megabyte.
    if "\\u0000" in text and _ESCAPED_NUL.search(text):
        raise InvalidPayload(argument, value, "free of NUL characters (jsonb cannot store \\u0000)")
    if max_bytes is not None:
        if size > max_bytes:
            raise too_large(argument, value, f"at most {max_bytes} bytes of JSON", got=f"{size} bytes of JSON")
    return text


_JSON_VALUE = "a JSON value"


def serialize_output(value: Any, *, max_bytes: int) -> str:
    """Return an output as compact JSON text, refusing one larger than ``max_bytes`` encoded.

    Outputs are read back whole (a dependent's ``output_of``, the job's page), so
    they are bounded like payloads.

    Raises:
        InvalidArgument: ``max_bytes`` is not a positive int.
        InvalidPayload: as :func:`serialize_json`.
        OutputTooLarge: larger than ``max_bytes`` encoded; the message gives both sizes, not the output.
    """
    check_int("max_output_bytes", max_bytes, MAX_OUTPUT_BYTES_RANGE)
    return serialize_json("output", value, max_bytes=max_bytes, too_large=OutputTooLarge)


def serialize_checkpoint(value: Any, *, max_bytes: int) -> str:
    """Return a checkpoint as compact JSON text, refusing one larger than ``max_bytes`` encoded.

    A checkpoint is read back whole with its job at every run, as its payload
    is, so the worker bounds it by its payload limit (``max_payload_bytes``).

    Raises:
        InvalidArgument: ``max_bytes`` is not a positive int.
        InvalidPayload: as :func:`serialize_json`.
        CheckpointTooLarge: larger than ``max_bytes`` encoded; the message gives both sizes, not the checkpoint.
    """
    check_int("max_checkpoint_bytes", max_bytes, MAX_PAYLOAD_BYTES_RANGE)
    return serialize_json("checkpoint", value, max_bytes=max_bytes, too_large=CheckpointTooLarge)


def _holds_what_dumps_accepts_but_jsonb_loses(value: Any) -> bool:
    """True for a non-string key or an int too long to store, both of which json.dumps writes.

    json.dumps writes the key 1 as "1", so {1: "a", "1": "b"} would be stored as
    {"1": "b"}; and with the interpreter's digit limit lifted it writes ints
    PostgreSQL's numeric overflows on. Run only after json.dumps succeeded, so
    the value holds no cycle and no unknown type.
    """
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if not all(isinstance(key, str) for key in node):
                return True
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
        elif isinstance(node, int) and int_too_long(node):
            return True
    return False


def completion_progress_problem(done: Optional[int], total: Optional[int]) -> Optional[str]:
    """Return why a handler's success progress is invalid, or None; the seed's wording."""
    if done is not None and done < 0:
        return (
            "Handler returned invalid success progress: progress_done must be greater than or "
            f"equal to zero, got {done}."
        )
    if total is not None and total < 0:
        return (
            "Handler returned invalid success progress: progress_total must be greater than or "
            f"equal to zero, got {total}."
        )
    if done is not None and total is not None and done > total:
        return (
            "Handler returned invalid success progress: progress_done must not exceed progress_total, "
            f"got progress_done={done}, progress_total={total}."
        )
    return None


def check_progress_values(done: Any, total: Any, *, completion: bool) -> None:
    """Raise unless done/total are None or non-negative ints with done <= total."""
    error = InvalidCompletionProgress if completion else InvalidProgress
    for name, value in (("progress_done", done), ("progress_total", total)):
        if value is not None and not _is_int(value):
            raise error(f"{name} must be an integer or None, got {type_phrase(value)}")
        # The columns are bigint: a larger value would fail inside PostgreSQL as db.query_failed.
        if value is not None and value > BIGINT_MAX:
            raise error(f"{name} must be at most {BIGINT_MAX}, got {echo_or_shape(value)}")
    problem = completion_progress_problem(done, total)
    if problem is not None:
        raise error(problem if completion else problem.replace("Handler returned invalid success progress: ", ""))
