"""Log output for the ``runledger_sync`` loggers (JSON lines or plain text), and the per-job log fields.

The library itself only creates loggers; an application (or the CLI) calls
:func:`configure_logging` once to print them. Payloads are never logged: they
may hold personal data or secrets, so nothing here accepts one.

One line per finished job goes to the ``runledger_sync.jobs`` logger at INFO.
That logger is off (WARNING) until asked for, by :func:`configure_logging` in
text mode or by the application's own logging setup: a line per job costs a
busy worker more than the job does, so production logs get the worker's
summary a minute instead.
"""

from __future__ import annotations

import json as _json_module
import logging as _logging
import os
import sys
from typing import IO, Any, Optional, Union
from uuid import UUID

from runledger_sync.core.errors import ConfigError
from runledger_sync.core.escapes import escape_controls
from runledger_sync.core.evidence import format_traceback

try:
    # python-json-logger >= 3.1. The old module path still works there but emits
    # a DeprecationWarning, which the test suite turns into an error.
    from pythonjsonlogger.json import JsonFormatter as _JsonFormatter
except ImportError:  # pragma: no cover - python-json-logger < 3.1
    from pythonjsonlogger.jsonlogger import JsonFormatter as _JsonFormatter

#: The logger every module of the package logs under.
ROOT_LOGGER_NAME = "runledger_sync"
#: The logger of the one line per finished job (off until asked for).
JOB_LINES_LOGGER_NAME = "runledger_sync.jobs"
#: The log formats :func:`configure_logging` prints, as ``worker --log-format`` names them.
LOG_FORMATS = ("text", "json")
#: The variable a worker command reads when no --log-format is given.
LOG_FORMAT_VARIABLE = "RUNLEDGER_LOG_FORMAT"

_logging.getLogger(JOB_LINES_LOGGER_NAME).setLevel(_logging.WARNING)

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Each line of a text record after its first (a traceback's, a stack's) starts with this,
# so no line of it reads as a record of its own.
_TEXT_CONTINUATION = "  "
_JSON_FORMAT = "%(levelname)s %(name)s %(message)s"
# Marks the handler configure_logging() installed, so a second call replaces it.
_HANDLER_MARK = "_runledger_sync_handler"


def get_logger(name: str) -> _logging.Logger:
    """Return the logger ``name`` under ``runledger_sync``.

    ``get_logger(__name__)`` inside the package returns that module's logger;
    ``get_logger("worker")`` returns ``runledger_sync.worker``.
    """
    if name == ROOT_LOGGER_NAME or name.startswith(ROOT_LOGGER_NAME + "."):
        return _logging.getLogger(name)
    return _logging.getLogger(f"{ROOT_LOGGER_NAME}.{name}")


def configure_logging(
    level: Union[int, str] = "INFO",
    stream: Optional[IO[str]] = None,
    json: bool = True,
    job_lines: Optional[bool] = None,
) -> _logging.Handler:
    """Print the ``runledger_sync`` loggers, one JSON object per line by default.

    Each JSON line has ``timestamp``, ``level``, ``logger`` and ``message``, plus
    any ``extra=`` fields (see :func:`job_log_fields`); a text line has the time,
    level, logger and message, then the same fields as ``key=value``. Calling it again replaces
    the handler it installed before instead of adding a second one. Records
    still propagate to the root logger, so an application that also prints the
    root logger sees them twice; configure one or the other.

    Example:
        ``configure_logging(level="DEBUG")``

    Args:
        level: The level of the ``runledger_sync`` logger (name or number).
        stream: Where lines go; ``sys.stderr`` when None.
        json: False prints plain text lines instead, for a terminal.
        job_lines: print one INFO line per finished job (job type, id, outcome,
            attempt, duration; never the payload) on ``runledger_sync.jobs``.
            None (the default) prints them in text mode only.

    Returns:
        The installed handler.
    """
    logger = _logging.getLogger(ROOT_LOGGER_NAME)
    for existing in list(logger.handlers):
        if getattr(existing, _HANDLER_MARK, False):
            logger.removeHandler(existing)
            existing.close()
    handler = _logging.StreamHandler(stream) if stream is not None else _CurrentStderrHandler()
    handler.setFormatter(_json_formatter() if json else _TextFormatter(_TEXT_FORMAT))
    setattr(handler, _HANDLER_MARK, True)
    logger.addHandler(handler)
    logger.setLevel(level.upper() if isinstance(level, str) else level)
    wanted = (not json) if job_lines is None else job_lines
    # Never below the package's level: WARNING there means no job lines either.
    _logging.getLogger(JOB_LINES_LOGGER_NAME).setLevel(
        max(logger.level, _logging.INFO) if wanted else _logging.WARNING)
    return handler


class _CurrentStderrHandler(_logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a line is written, not when logging was set up.

    A program (or a test runner) may replace and later close the stderr it had
    when the worker's logging was configured; lines keep going to the current one.
    """

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass  # StreamHandler.__init__ assigns one; the current sys.stderr is always used instead


def configured_setup() -> Optional[dict[str, Any]]:
    """Return the arguments :func:`configure_logging` was last called with, or None if it was not.

    A worker process started by the parent calls ``configure_logging(**setup)`` with
    them, so its lines look like the parent's. Only ``sys.stdout`` is told apart as
    a stream; any other stream reads as ``sys.stderr`` (another process cannot write
    into this one's objects).
    """
    logger = _logging.getLogger(ROOT_LOGGER_NAME)
    for handler in logger.handlers:
        if getattr(handler, _HANDLER_MARK, False):
            stream = getattr(handler, "stream", None)
            return {
                "level": logger.level,
                "stream_name": "stdout" if stream is sys.stdout else "stderr",
                "json": isinstance(handler.formatter, _JsonFormatter),
                "job_lines": _logging.getLogger(JOB_LINES_LOGGER_NAME).level <= _logging.INFO,
            }
    return None


def resolve_log_format(given: Optional[str] = None) -> str:
    """The format a worker command logs in: ``given`` (its --log-format), else
    ``$RUNLEDGER_LOG_FORMAT``, else text on a terminal and JSON for a log collector.

    Raises:
        ConfigError: the variable holds neither ``text`` nor ``json``.
    """
    if given is not None:
        return given
    from_environment = os.environ.get(LOG_FORMAT_VARIABLE, "").strip().lower()
    if from_environment:
        if from_environment not in LOG_FORMATS:
            raise ConfigError([f"{LOG_FORMAT_VARIABLE} must be one of {', '.join(LOG_FORMATS)}, "
                               f"got {os.environ[LOG_FORMAT_VARIABLE]!r}"])
        return from_environment
    isatty = getattr(sys.stderr, "isatty", None)  # a replaced stderr may not have one
    return "text" if isatty is not None and isatty() else "json"


def configure_logging_unless_configured(
    level: Union[int, str] = "INFO", log_format: Optional[str] = None,
) -> Optional[_logging.Handler]:
    """Install our handler only when neither our logger nor the root logger has one.

    For entry points (the Flask and Django worker commands) that must print logs
    by default but must not override logging an application already set up. The
    format is :func:`resolve_log_format`'s.
    """
    json = resolve_log_format(log_format) == "json"
    if _logging.getLogger(ROOT_LOGGER_NAME).handlers or _logging.getLogger().handlers:
        return None
    return configure_logging(level=level, json=json)


def job_log_fields(
    *,
    job_id: UUID,
    job_type: str,
    run_number: int,
    attempt: int,
    organization_id: Optional[Any],
    worker_id: Optional[str],
) -> dict[str, Any]:
    """Return the ``extra=`` fields every log record about one attempt carries.

    Example:
        ``log.info("job claimed", extra=job_log_fields(job_id=job.id, ...))``

    Args:
        job_id: The job's id.
        job_type: The job's type.
        run_number: The run (1, then +1 per requeue).
        attempt: The attempt within the run.
        organization_id: The owning organization, or None for global jobs.
        worker_id: The worker holding the lease.

    Returns:
        A dict with ids as strings, ready to pass as ``extra``.
    """
    return {
        "job_id": str(job_id),
        "job_type": job_type,
        "run_number": run_number,
        "attempt": attempt,
        "organization_id": None if organization_id is None else str(organization_id),
        "worker_id": None if worker_id is None else str(worker_id),
    }


# What every LogRecord has: anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(vars(_logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _format_exception(formatter: _logging.Formatter, ei: Any, *, escaped_messages: bool = False) -> str:
    # The traceback as a failed attempt's row keeps it (runledger_sync.core.evidence):
    # the same frames, no locals, and a database error's message without the later
    # lines that repeat its statement's parameters, which come from payloads. The
    # record keeps the exception itself, for error trackers' logging integrations.
    if ei and ei[1] is not None:
        return format_traceback(ei[1], escaped_messages=escaped_messages).rstrip("\n")
    return _logging.Formatter.formatException(formatter, ei)


class _TextFormatter(_logging.Formatter):
    """The time, level, logger and message, then each ``extra=`` field as ``key=value`` (job lines: the message).

    A record is one line, whatever its message and fields hold: their control
    characters are escaped (``\\x0a``, ``\\x1b``), so a handler's message cannot
    forge a record or drive the terminal. A traceback or stack follows on lines
    of its own, each indented and escaped; only the traceback's own structure
    breaks lines, never the text of an exception.
    """

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return _continuation_lines(_format_exception(self, ei, escaped_messages=True))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 - logging's name
        return _continuation_lines(stack_info)

    def formatMessage(self, record: _logging.LogRecord) -> str:  # noqa: N802 - logging's name
        line = super().formatMessage(record)
        if record.name != JOB_LINES_LOGGER_NAME:  # a job line's message already says what the fields do
            fields = [f"{key}={_text_value(value)}" for key, value in record.__dict__.items()
                      if key not in _RECORD_ATTRIBUTES and not key.startswith("_")]
            line = " ".join([line, *fields])
        return escape_controls(line)


def _continuation_lines(text: str) -> str:
    return "\n".join(_TEXT_CONTINUATION + escape_controls(line) for line in text.split("\n"))


def _text_value(value: Any) -> str:
    text = str(value)
    return text if text and not any(c.isspace() or c in "\"=" for c in text) else _json_module.dumps(text)


class _JsonLinesFormatter(_JsonFormatter):
    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return _format_exception(self, ei)


def _json_formatter() -> _logging.Formatter:
    return _JsonLinesFormatter(
        _JSON_FORMAT,
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp=True,
    )
