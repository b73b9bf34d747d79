"""Secrets stay out of errors and logs: URL passwords are masked, payloads and outputs unlogged.

Every check captures all of it: the exception's text, repr, details and its
whole formatted chain (the driver's error is its ``__cause__``), every log
record of every logger at DEBUG, and the console script's stderr with and
without ``--debug``.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
import traceback
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import make_url

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.store.attempt.ends import complete_job_success
from runledger_sync.store.attempt.running import update_job_progress
from tests.support import claim_one, configured_logging, define, identity, run_worker_until, wait_until

PASSWORD = "Pw-d0nt-l0g-m3"  # noqa: S105 - a marker to search for, not a credential
# URL-encoded in the URL; both spellings must stay hidden.
TRICKY_PASSWORD = "p@ss:w/rd%!"
JOB_TYPE = "secret.job"
PAYLOAD_SECRET = "payload-secret-4f1c"
OUTPUT_SECRET = "output-secret-9a2e"
CHECKPOINT_SECRET = "checkpoint-secret-77b0"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def unreachable_url(password: str = PASSWORD) -> str:
    return make_url(f"postgresql://app@127.0.0.1:{closed_port()}/app").set(password=password).render_as_string(
        hide_password=False)


def secret_spellings(password: str) -> set[str]:
    from urllib.parse import quote

    return {password, quote(password, safe="")}


@pytest.fixture
def all_logs() -> Iterator[io.StringIO]:
    """Every record of every logger, DEBUG and up, rendered with its extra fields."""
    stream = io.StringIO()

    class Everything(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return f"{super().format(record)} {record.__dict__!r}"

    handler = logging.StreamHandler(stream)
    handler.setFormatter(Everything("%(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


def everything_about(exc: BaseException) -> str:
    details = getattr(exc, "details", {})
    return "\n".join([str(exc), repr(exc), repr(details), *traceback.format_exception(exc)])


OPERATIONS: list[tuple[str, Callable[[Any], Any]]] = [
    ("enqueue", lambda engine: rl.enqueue(engine, JOB_TYPE, {})),
    ("get_job", lambda engine: rl.get_job(engine, "00000000-0000-7000-8000-000000000000")),
    ("list_jobs", lambda engine: rl.list_jobs(engine)),
    ("queue_stats", lambda engine: rl.queue_stats(engine)),
    ("migrate", lambda engine: rl.migrate(engine)),
    ("check_schema", lambda engine: rl.check_schema(engine)),
    ("current_revision", lambda engine: rl.current_revision(engine)),
]


@pytest.mark.parametrize("password", [PASSWORD, TRICKY_PASSWORD], ids=["plain", "url-encoded"])
@pytest.mark.parametrize("operation", [op[1] for op in OPERATIONS], ids=[op[0] for op in OPERATIONS])
def test_connection_errors_and_logs_never_show_the_password(all_logs, operation, password):
    engine = rl.create_engine(unreachable_url(password))
    try:
        with pytest.raises(rl.RunledgerError) as caught:
            operation(engine)
    finally:
        engine.dispose()

    assert caught.value.code in ("db.connection_failed", "db.migration_failed", "db.schema_mismatch")
    seen = everything_about(caught.value) + all_logs.getvalue()
    for secret in secret_spellings(password):
        assert secret not in seen


@pytest.mark.parametrize("url", ["mysql://app:{pw}@h/app", "postgresql://app:{pw}@h:notaport/app",
                                 "postgresql://app:{pw}@[::1/app"], ids=["not-postgres", "bad-port", "bad-host"])
def test_a_rejected_url_is_reported_without_its_password(url):
    with pytest.raises(rl.ConfigError) as caught:
        rl.create_engine(url.format(pw=PASSWORD))
    assert caught.value.code == "config.invalid"
    assert PASSWORD not in everything_about(caught.value)


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("argv", [["stats"], ["jobs", "list"], ["migrate"], ["check-schema"],
                                  ["enqueue", JOB_TYPE, "{}"], ["dead-letters", "replay"]],
                         ids=lambda argv: " ".join(argv))
def test_the_console_never_prints_the_password(capsys, monkeypatch, argv, debug):
    monkeypatch.delenv("RUNLEDGER_DATABASE_URL", raising=False)
    root = logging.getLogger("runledger_sync")
    handlers, level = list(root.handlers), root.level
    try:
        code = cli.main(["--database-url", unreachable_url(TRICKY_PASSWORD), *argv, *(["--debug"] if debug else [])])
    finally:
        for handler in set(root.handlers) - set(handlers):
            root.removeHandler(handler)
        root.setLevel(level)
    out, err = capsys.readouterr()

    assert code == 1
    assert "error: db.connection_failed: " in err or "error: db.migration_failed: " in err
    for secret in secret_spellings(TRICKY_PASSWORD):
        assert secret not in out + err
    assert ("Traceback" in err) == debug


@pytest.mark.parametrize(("user", "password"), [("app", "o"), ("postgres", "postgres"), ("app", "p%40ss")],
                         ids=["one-letter", "same-as-user", "url-escaped"])
def test_the_console_masks_the_url_and_leaves_the_message_intact(capsys, monkeypatch, user, password):
    monkeypatch.delenv("RUNLEDGER_DATABASE_URL", raising=False)
    port = closed_port()
    url = f"postgresql://{user}:{password}@127.0.0.1:{port}/app"
    engine = rl.create_engine(url)
    try:
        with pytest.raises(rl.ConnectionFailed) as caught:
            rl.queue_stats(engine)
    finally:
        engine.dispose()

    code = cli.main(["--database-url", url, "stats"])
    err = capsys.readouterr().err

    # The library's message: the URL masked where it stands, the driver's words as they were
    # (a password searched for in the text would have masked "o" in "connection", or the user "postgres").
    assert caught.value.message == (
        f"database connection failed (postgresql+psycopg2://{user}:***@127.0.0.1:{port}/app): "
        f'connection to server at "127.0.0.1", port {port} failed: Connection refused'
    )
    # The console prints that very message: nothing in it is masked a second time.
    assert code == 1
    assert err.splitlines()[0] == f"error: db.connection_failed: {caught.value.message}"


def test_a_worker_that_cannot_reach_the_database_logs_no_password(all_logs):
    engine = rl.create_engine(unreachable_url())
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: None)
    shutdown = threading.Event()
    worker = threading.Thread(target=rl.run_worker_loop,
                              args=(engine, registry, rl.JobsConfig(poll_interval_ms=50), shutdown))
    worker.start()
    try:
        wait_until(lambda: "claim failed" in all_logs.getvalue(), timeout=60)
    finally:
        shutdown.set()
        worker.join(30)
        engine.dispose()

    assert not worker.is_alive()
    assert PASSWORD not in all_logs.getvalue()


# -- payloads and outputs ---------------------------------------------------------------


def run_jobs_and_capture_json_logs(engine: Any, config: rl.JobsConfig) -> str:
    registry = rl.JobRegistry()
    hook_ran = threading.Event()

    @registry.job(JOB_TYPE, max_attempts=1, on_dead_letter=lambda ctx, payload, info: hook_ran.set())
    def handle(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        if payload["mode"] == "fail":
            raise rl.JobFailure.terminal("secret.refused", "refused without saying why")
        if payload["mode"] == "crash":
            raise RuntimeError("handler crashed")
        return rl.JobCompletion(progress_done=1, progress_total=1, checkpoint={"token": CHECKPOINT_SECRET},
                                output={"token": OUTPUT_SECRET})

    registry.sync_definitions(engine)
    for mode in ("ok", "fail", "crash"):
        rl.enqueue(engine, JOB_TYPE, {"mode": mode, "api_key": PAYLOAD_SECRET}, organization_id="org-1")
    stream = io.StringIO()
    shutdown = threading.Event()
    worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, config, shutdown))
    with configured_logging(level="DEBUG", stream=stream):
        worker.start()
        try:
            wait_until(lambda: rl.count_jobs(engine, status=rl.JobStatus.PENDING)
                       + rl.count_jobs(engine, status=rl.JobStatus.LEASED) == 0, timeout=30)
            assert hook_ran.wait(10)
        finally:
            shutdown.set()
            worker.join(30)
    assert rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) == 1
    assert rl.count_jobs(engine, status=rl.JobStatus.DEAD_LETTERED) == 2
    return stream.getvalue()


FAST = dict(poll_interval_ms=20, lease_ttl_seconds=5, heartbeat_interval_seconds=0.5,
            dead_letter_hook_timeout_seconds=2)


def test_payloads_checkpoints_and_outputs_never_reach_the_logs(engine):
    logs = run_jobs_and_capture_json_logs(engine, rl.JobsConfig(**FAST))

    assert "jobs processed" in logs  # the capture did see the worker's lines
    assert '"organization_id": "org-1"' in logs
    for secret in (PAYLOAD_SECRET, OUTPUT_SECRET, CHECKPOINT_SECRET):
        assert secret not in logs


def test_log_payloads_on_puts_payloads_in_the_debug_logs(engine):
    logs = run_jobs_and_capture_json_logs(engine, rl.JobsConfig(**FAST, log_payloads=True))

    assert PAYLOAD_SECRET in logs


# -- error messages about payloads, outputs and checkpoints --------------------------------------

# Each holds a secret beside a part jsonb refuses; the old messages repeated the whole value.
REFUSED_VALUES = [
    pytest.param(lambda secret: {"api_key": secret, "s": {1, 2}}, id="set"),
    pytest.param(lambda secret: {"api_key": secret, "n": float("nan")}, id="nan"),
    pytest.param(lambda secret: {"api_key": secret + "\x00"}, id="nul-in-secret"),
    pytest.param(lambda secret: {"api_key": secret + "\ud800"}, id="surrogate-in-secret"),
    pytest.param(lambda secret: {"api_key": secret, (1, 2): "tuple key"}, id="tuple-key"),
    pytest.param(lambda secret: [secret, b"raw"], id="bytes"),
]


@pytest.mark.parametrize("make", REFUSED_VALUES)
def test_a_refused_payload_never_appears_in_the_enqueue_error(engine, make):
    define(engine, JOB_TYPE, max_attempts=1)

    with pytest.raises(rl.InvalidPayload) as caught:
        rl.enqueue(engine, JOB_TYPE, make(PAYLOAD_SECRET))

    assert caught.value.code == "job.invalid_payload"
    assert PAYLOAD_SECRET not in everything_about(caught.value)
    assert rl.count_jobs(engine) == 0


@pytest.mark.parametrize("make", REFUSED_VALUES)
@pytest.mark.parametrize("field", ["output", "checkpoint"])
def test_a_refused_completion_never_appears_in_the_store_error(engine, make, field):
    define(engine, JOB_TYPE, max_attempts=1)
    job = rl.enqueue(engine, JOB_TYPE, {})
    lease = identity(claim_one(engine, job_type=JOB_TYPE))
    completion = rl.JobCompletion(**{field: make(OUTPUT_SECRET)})

    with pytest.raises(rl.InvalidPayload) as caught:
        complete_job_success(engine, **lease, completion=completion)
    with pytest.raises(rl.InvalidPayload) as progress:
        update_job_progress(engine, **lease, checkpoint=make(CHECKPOINT_SECRET))

    assert caught.value.message.startswith(f"{field} must be ")
    assert OUTPUT_SECRET not in everything_about(caught.value)
    assert CHECKPOINT_SECRET not in everything_about(progress.value)
    assert rl.get_job(engine, job.id).status is rl.JobStatus.LEASED


def test_a_handlers_refused_output_is_recorded_without_its_content(engine, all_logs):
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE, max_attempts=1)
    def handle(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        return rl.JobCompletion(output={"token": OUTPUT_SECRET, "seen": {1, 2}})

    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, {})
    run_worker_until(engine, registry, rl.JobsConfig(**FAST),
                     lambda: rl.get_job(engine, job.id).status is rl.JobStatus.DEAD_LETTERED)

    finished = rl.get_job(engine, job.id)
    assert "got a dict holding a set at key 'seen'" in finished.last_error_message
    assert OUTPUT_SECRET not in finished.last_error_message
    assert OUTPUT_SECRET not in repr(rl.list_attempts(engine, job.id))
    assert OUTPUT_SECRET not in all_logs.getvalue()


@pytest.mark.parametrize("debug", [[], ["--debug"]], ids=["plain", "debug"])
def test_the_console_never_repeats_a_payload_it_cannot_parse(capsys, debug):
    code = cli.main([*debug, "enqueue", JOB_TYPE, '{"api_key": "%s", oops}' % PAYLOAD_SECRET])

    err = capsys.readouterr().err
    assert code == 2
    assert "error: job.invalid_payload: the JSON argument must be valid JSON" in err
    assert PAYLOAD_SECRET not in err


@pytest.mark.parametrize("query", [f"sslpassword={PASSWORD}", f"sslmode=disable&password={PASSWORD}",
                                   f"auth_token={PASSWORD}"], ids=["sslpassword", "password", "token"])
def test_the_console_masks_every_secret_query_parameter(capsys, monkeypatch, query):
    monkeypatch.delenv("RUNLEDGER_DATABASE_URL", raising=False)
    url = f"postgresql://app@127.0.0.1:{closed_port()}/app?{query}"
    code = cli.main(["--database-url", url, "stats"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: db.")
    assert PASSWORD not in err
