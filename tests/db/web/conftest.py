"""Fixtures of the dashboard tests: seeded jobs in every state, and the WSGI app under a test client."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator, Optional
from urllib.parse import urlsplit
from wsgiref.simple_server import make_server

import pytest
from werkzeug.test import Client

import runledger_sync as rl
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from runledger_sync.web import allow_anyone, create_app
from tests.support import define

EMAIL = "web.email"
REPORT = "web.report"
#: Jobs driven past PENDING are enqueued at the top priority so the claim that follows picks exactly them.
TOP = 1_000_000
#: What an attacker would put in every field a user controls.
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
REPO = Path(__file__).resolve().parents[3]
#: The origin werkzeug's test client addresses (base_url http://localhost/), which a browser's POST names.
OWN_ORIGIN = "http://localhost"
CSRF_FIELD = re.compile(r'name="csrf_token" value="([0-9a-f]{64})"')


@pytest.fixture
def db(engine):
    define(engine, EMAIL, max_attempts=3)
    define(engine, REPORT, max_attempts=1)
    return engine


def finish(db: Any, job: rl.JobRecord, *, fail: bool, code: str = "web.bad_input", message: str = "cannot be processed",
           worker_id: str = "web-worker", error_type: Optional[str] = None) -> rl.JobRecord:
    claimed = claim_jobs(db, worker_id=worker_id, lease_ttl_seconds=60, limit=1, job_types=[job.job_type])
    assert [c.id for c in claimed] == [job.id]
    identity = LeaseIdentity.of(claimed[0]).keywords()
    if fail:
        failure = rl.JobFailure.terminal(code, message)
        return complete_job_failure(db, **identity, failure=failure, retry_delay_ms=None, error_type=error_type)
    return complete_job_success(db, **identity, completion=rl.JobCompletion.success().with_output({"sent": True}))


def dead_lettered(db: Any, job_type: str = EMAIL, payload: Any = None, *, code: str = "web.bad_input",
                  error_type: Optional[str] = None, **options: Any) -> rl.JobRecord:
    job = rl.enqueue(db, job_type, payload if payload is not None else {"n": 1}, priority=TOP, **options)
    return finish(db, job, fail=True, code=code, error_type=error_type)


def succeeded(db: Any, job_type: str = EMAIL, **options: Any) -> rl.JobRecord:
    return finish(db, rl.enqueue(db, job_type, {"n": 1}, priority=TOP, **options), fail=False)


def allow_all(request: Any, action: str) -> bool:
    return True


class Browser(Client):
    """A test client that, as every current browser does, names the origin of its page in each POST.

    A post that passes its own ``Origin`` or ``Sec-Fetch-Site`` sends only that.
    """

    def post(self, *args: Any, **kwargs: Any) -> Any:
        headers = dict(kwargs.pop("headers", None) or {})
        if not {"origin", "sec-fetch-site"} & {name.lower() for name in headers}:
            base = urlsplit(kwargs.get("base_url") or OWN_ORIGIN)
            headers["Origin"] = f"{base.scheme}://{base.netloc}"
        return super().post(*args, headers=headers, **kwargs)


@pytest.fixture
def client(db) -> Client:
    """A client of a read-only dashboard that lets anyone read."""
    return Browser(create_app(db, authorize=allow_anyone))


@pytest.fixture
def admin(db) -> Client:
    """A client of a dashboard whose actions are enabled and allowed."""
    return Browser(create_app(db, read_only=False, authorize=allow_all))


def page(client: Client, url: str, status: int = 200) -> str:
    response = client.get(url)
    assert response.status_code == status, response.get_data(as_text=True)
    return response.get_data(as_text=True)


def post_form(client: Client, page_url: str, action_url: str, data: dict[str, Any]) -> Any:
    """Load ``page_url`` (which sets the CSRF cookie and draws the form), then post ``data`` with its token."""
    token = CSRF_FIELD.search(page(client, page_url))
    assert token is not None, f"{page_url} draws no form"
    return client.post(action_url, data={**data, "csrf_token": token.group(1)})


@contextlib.contextmanager
def dashboard_process(database_url: str, *options: str) -> Iterator[str]:
    """Run ``runledger-sync dashboard --port 0`` in a process; yield its base URL; stop it with SIGTERM (exit 0)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "runledger_sync.cli", "--database-url", database_url, "dashboard", "--port", "0", *options],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = process.stdout.readline()
        found = re.search(r"(http://[\d.]+:\d+)/", first)
        assert found, f"no address printed: {first!r} {process.stderr.read() if process.poll() is not None else ''}"
        yield found.group(1)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve a WSGI app on a free local port in a thread; yield its base URL."""
    from runledger_sync.cli.dashboard import _QuietHandler, _ThreadingServer

    server = make_server("127.0.0.1", 0, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
