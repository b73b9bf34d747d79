"""The dashboard's HTTP hardening: bad query values, security headers everywhere, the standalone server's limits."""

from __future__ import annotations

import http.client
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import runledger_sync as rl
from runledger_sync.cli import dashboard as dashboard_cli
from runledger_sync.web import allow_anyone, create_app
from tests.db.web.conftest import Browser, EMAIL, REPO, allow_all, dashboard_process, dead_lettered, serving

#: Query values a hostile or careless client sends: a superscript digit (str.isdigit() says yes, int() says no),
#: more digits than int() parses, NUL, bytes that are not UTF-8, a long text, a number in another script.
BAD_VALUES = ["²", "9" * 4301, "%00", "a%00b", "%ff%fe", "x" * 5000, "-1", "1e5", "٣"]
QUERY_PARAMETERS = {
    "/": ["refresh", "queue"], "/jobs": ["status", "type", "org", "q", "before"], "/dead-letters": ["type", "org", "replayed"],
    "/schedules": ["done", "name"], "/workflows": ["run"], "/queues": ["queue", "done", "name"],
}


def assert_hardened(response, what: str = "") -> None:
    headers = response.headers
    assert headers["X-Frame-Options"] == "DENY", what
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], what
    assert headers["X-Content-Type-Options"] == "nosniff", what
    assert headers["Referrer-Policy"] == "same-origin", what


@pytest.mark.parametrize("url", ["/dead-letters?replayed=²", "/dead-letters?replayed=" + "9" * 4301])
def test_a_bad_count_in_the_query_is_a_coded_400_with_every_security_header(db, client, url):
    response = client.get(url)
    assert response.status_code == 400
    assert 'id="error-code">job.invalid_argument<' in response.get_data(as_text=True)
    assert_hardened(response)


def test_no_query_value_makes_a_page_fail(db, client):
    dead_lettered(db)
    for path, parameters in QUERY_PARAMETERS.items():
        for name in parameters:
            for value in BAD_VALUES:
                response = client.get(f"{path}?{name}={value}")
                assert response.status_code in (200, 400, 404), (path, name, value[:20], response.status_code)
                assert_hardened(response)
                if response.status_code != 200:
                    assert re.search(r'id="error-code">[a-z]+\.[a-z_]+<', response.get_data(as_text=True))


def test_every_kind_of_response_carries_the_security_headers(db):
    job = rl.enqueue(db, EMAIL, {"n": 1})
    admin = Browser(create_app(db, read_only=False, authorize=allow_all))
    token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', admin.get(f"/jobs/{job.id}").get_data(as_text=True))
    responses = {
        "page": admin.get("/"),
        "stylesheet": admin.get("/static/style.css"),
        "not found": admin.get("/nowhere"),
        "method not allowed": admin.post("/jobs"),
        "redirect": admin.post(f"/jobs/{job.id}/cancel", data={"csrf_token": token.group(1)}),
        "refused": Browser(create_app(db)).get("/"),
        "hook failure": Browser(create_app(db, authorize=lambda request, action: 1 / 0)).get("/"),
    }
    assert [r.status_code for r in responses.values()] == [200, 200, 404, 405, 303, 403, 500]
    for kind, response in responses.items():
        assert_hardened(response, kind)
    assert "web.internal_error" in responses["hook failure"].get_data(as_text=True)


def test_an_unmigrated_database_is_a_503_page_naming_the_migrate_command(empty_database):
    engine = rl.create_engine(empty_database)
    try:
        dashboard = Browser(create_app(engine, authorize=allow_anyone))
        for url in ("/", "/jobs", "/dead-letters", "/schedules", "/workflows", "/queues"):
            response = dashboard.get(url)
            html = response.get_data(as_text=True)
            assert response.status_code == 503, url
            assert 'id="error-code">db.schema_mismatch<' in html and "runledger-sync migrate" in html
            assert_hardened(response)
    finally:
        engine.dispose()


def test_a_body_shorter_than_its_content_length_is_answered_within_the_read_timeout(db, monkeypatch):
    monkeypatch.setattr(dashboard_cli._QuietHandler, "timeout", 1.0)
    job = dead_lettered(db)
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        port = int(base.rsplit(":", 1)[1])
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=15) as connection:
            connection.sendall(b"POST /dead-letters/replay HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://127.0.0.1\r\n"
                               b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n"
                               b"job_id=" + str(job.id).encode())
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.0 400") and b'id="error-code">web.incomplete_body<' in answer
    assert elapsed < 10
    assert rl.get_job(db, job.id).status is rl.JobStatus.DEAD_LETTERED


def test_dashboard_command_names_no_python_version_and_refuses_with_its_own_flag(db, fresh_database):
    job = dead_lettered(db)
    with dashboard_process(fresh_database) as base:
        with urllib.request.urlopen(base + "/static/style.css", timeout=30) as response:  # noqa: S310 - loopback
            server = response.headers["Server"]
            assert response.headers["X-Frame-Options"] == "DENY" and response.headers["X-Content-Type-Options"] == "nosniff"
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(base + "/dead-letters/replay", data=f"job_id={job.id}".encode(), timeout=30)  # noqa: S310
        refused = raised.value
        html = refused.read().decode()
        assert refused.code == 403 and refused.headers["X-Frame-Options"] == "DENY"
    assert server == "runledger-sync" and "Python" not in server
    assert 'id="error-code">web.read_only<' in html and "--allow-actions" in html and "create_app" not in html


def test_dashboard_command_on_a_busy_port_is_a_coded_error(fresh_database):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "runledger_sync.cli", "--database-url", fresh_database, "dashboard", "--port", str(port)],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )
    assert done.returncode == 2, done.stderr
    assert f"error: config.invalid: --port {port} cannot be served on '127.0.0.1'" in done.stderr
    assert "hint: pick a free --port" in done.stderr and "internal" not in done.stderr


def get_with_host(base: str, host: str) -> tuple[int, str]:
    address, port = base.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(address, int(port), timeout=30)
    try:
        connection.request("GET", "/", headers={"Host": f"{host}:{port}"})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_dashboard_command_on_loopback_answers_only_to_loopback_host_names(fresh_database):
    with dashboard_process(fresh_database) as base:
        # What a browser sends for a page whose domain was re-pointed at 127.0.0.1 (DNS rebinding).
        status, html = get_with_host(base, "rebind.attacker.example")
        assert status == 400 and 'id="error-code">web.host_not_allowed<' in html
        assert [get_with_host(base, host)[0] for host in ("localhost", "127.0.0.1")] == [200, 200]
