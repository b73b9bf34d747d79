"""The queue commands (queues list|show|pause|resume|set) and what jobs show, stats and top say of queues.

Each test runs ``cli.main([...])`` in-process against a real PostgreSQL, then
checks what it printed against the rows it left behind.
"""

from __future__ import annotations

import json
import re

import pytest

import runledger_sync as rl
from tests.support import claim_one, define

MAIL = "q.mail"
REPORT = "q.report"
SECRET = "queue-payload-secret-51c2"


@pytest.fixture
def db(engine):
    """Queue mail (global limit 4, key limit 1): 2 ready, 1 held by its key, 1 scheduled, 1 leased."""
    rl.configure_queue(engine, "mail", global_limit=4, key_limit=1, rate_limit=rl.RateLimit(100, per_seconds=60))
    define(engine, MAIL, queue="mail")
    define(engine, REPORT)
    rl.enqueue(engine, MAIL, {"secret": SECRET}, priority=1_000_000)
    claim_one(engine, job_type=MAIL)
    rl.enqueue(engine, MAIL, {"secret": SECRET}, concurrency_key="customer:1")
    rl.enqueue(engine, MAIL, {"secret": SECRET}, concurrency_key="customer:1")
    rl.enqueue(engine, MAIL, {"secret": SECRET})
    rl.enqueue(engine, MAIL, {"secret": SECRET}, delay_seconds=3600)
    rl.enqueue(engine, REPORT, {"secret": SECRET})
    return engine


def table(out: str) -> dict[str, dict[str, str]]:
    """A printed table as {first cell: {header: cell}} (cells hold no double spaces)."""
    lines = [line for line in out.splitlines() if line.strip()]
    header = re.split(r"\s{2,}", lines[0])
    return {cells[0]: dict(zip(header, cells, strict=True))
            for cells in (re.split(r"\s{2,}", line) for line in lines[1:])}


def fields(out: str) -> dict[str, str]:
    return {label: value.strip() for label, _, value in (line.partition(":") for line in out.splitlines())}


def assert_error(err: str, code: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"error: {code}: ") and lines[1].startswith("hint: "), err


def test_queues_list_shows_every_queue_with_its_limits_and_counts(db, run):
    code, out, err = run("queues", "list")
    _, json_out, _ = run("queues", "list", "--json")

    assert code == 0, err
    shown = table(out)
    assert list(shown) == ["default", "mail"]
    assert shown["mail"] == {"queue": "mail", "paused": "no", "global_limit": "4", "key_limit": "1",
                             "rate_limit": "100/60s", "ready": "2", "held_by_key": "1", "scheduled": "1", "leased": "1"}
    assert shown["default"] == {"queue": "default", "paused": "no", "global_limit": "-", "key_limit": "1",
                                "rate_limit": "-", "ready": "1", "held_by_key": "0", "scheduled": "0", "leased": "0"}
    mail = {line["name"]: line for line in map(json.loads, json_out.splitlines())}["mail"]
    assert {key: mail[key] for key in ("paused", "global_limit", "key_limit", "rate_limit", "ready", "blocked_by_key",
                                       "scheduled", "leased", "rate_used")} == {
        "paused": False, "global_limit": 4, "key_limit": 1,
        "rate_limit": {"count": 100, "per_seconds": 60.0, "per_key": False},
        "ready": 2, "blocked_by_key": 1, "scheduled": 1, "leased": 1, "rate_used": 1}
    assert SECRET not in out + json_out


def test_queues_show_prints_one_queue_and_its_rate_budget_used(db, run):
    code, out, _ = run("queues", "show", "mail")
    _, json_out, _ = run("queues", "show", "mail", "--json")

    assert code == 0
    shown = fields(out)
    assert (shown["name"], shown["paused"], shown["global_limit"], shown["rate_limit"]) == ("mail", "no", "4", "100/60s")
    assert shown["rate_used"] == "1 of 100 in the last 60 s"
    assert (shown["ready"], shown["held_by_key"], shown["scheduled"], shown["leased"]) == ("2", "1", "1", "1")
    assert json.loads(json_out)["rate_used"] == 1 and json.loads(json_out)["name"] == "mail"


@pytest.mark.parametrize("verb", ["show", "pause", "resume"])
def test_an_unknown_queue_is_queue_not_found_and_exits_1(db, run, verb):
    code, out, err = run("queues", verb, "nosuch")

    assert code == 1 and out == ""
    assert_error(err, "queue.not_found")
    assert "'nosuch'" in err and "queues list" in err


def test_pause_and_resume_change_the_shared_setting_and_say_so(db, run):
    code, out, _ = run("queues", "pause", "mail")

    assert code == 0
    assert out.startswith("mail paused: no worker claims its jobs until `runledger-sync queues resume mail`")
    assert rl.get_queue(db, "mail").paused
    assert table(run("queues", "list")[1])["mail"]["paused"] == "yes"
    assert fields(run("queues", "show", "mail")[1])["paused"].startswith("yes, since ")

    code, out, _ = run("queues", "resume", "mail")

    assert code == 0 and out == "mail resumed: workers claim its jobs again\n"
    assert not rl.get_queue(db, "mail").paused


def test_set_changes_the_limits_given_and_keeps_the_others(db, run):
    code, out, _ = run("queues", "set", "mail", "--global-limit", "none", "--rate", "20/1s", "--per-key")

    assert code == 0
    assert out == "mail: global_limit -, key_limit 1, rate_limit 20/1s per key\n"
    queue = rl.get_queue(db, "mail")
    assert (queue.global_limit, queue.key_limit, queue.rate_limit) == (None, 1, rl.RateLimit(20, 1.0, per_key=True))

    run("queues", "set", "mail", "--key-limit", "3", "--rate", "none")
    queue = rl.get_queue(db, "mail")
    assert (queue.global_limit, queue.key_limit, queue.rate_limit) == (None, 3, None)
    # The higher key limit let the held-back job of customer:1 go.
    assert table(run("queues", "list")[1])["mail"]["held_by_key"] == "0"


def test_set_refuses_an_unknown_queue_unless_told_to_create_it(db, run):
    code, _, err = run("queues", "set", "mial", "--global-limit", "2")

    assert code == 1
    assert_error(err, "queue.not_found")
    assert [q.name for q in rl.list_queues(db)] == ["default", "mail"]

    code, out, _ = run("queues", "set", "payments", "--create", "--global-limit", "2", "--rate", "100/1m")

    assert code == 0 and out == "payments: global_limit 2, key_limit 1, rate_limit 100/60s\n"
    assert rl.get_queue(db, "payments").rate_limit == rl.RateLimit(100, 60.0)


def _job(db, status: rl.JobStatus, job_type: str = MAIL) -> rl.JobRecord:
    return next(job for job in rl.list_jobs(db, job_type=job_type) if job.status is status)


def test_jobs_show_says_why_a_pending_job_waits_with_its_queue_and_key(db, run):
    # list_jobs is newest first: the later job of the key is the one held back.
    held = next(job for job in rl.list_jobs(db, job_type=MAIL) if job.concurrency_key)

    code, out, _ = run("jobs", "show", str(held.id))
    _, json_out, _ = run("jobs", "show", str(held.id), "--json")

    assert code == 0
    shown = fields(out)
    assert shown["waits"].startswith("key_busy: concurrency key 'customer:1' is busy (key_limit 1): job ")
    assert (shown["queue"], shown["concurrency_key"]) == ("mail", "customer:1")
    wait = json.loads(json_out)["wait"]
    assert wait["reason"] == "key_busy" and wait["blocking_job_id"] in shown["waits"]

    rl.pause_queue(db, "mail")
    assert fields(run("jobs", "show", str(held.id))[1])["waits"].startswith("queue_paused: queue 'mail' is paused since ")


def test_jobs_show_of_a_job_that_does_not_wait_has_no_wait(db, run):
    leased = _job(db, rl.JobStatus.LEASED)

    code, out, _ = run("jobs", "show", str(leased.id))
    _, json_out, _ = run("jobs", "show", str(leased.id), "--json")

    assert code == 0
    assert "waits" not in fields(out)
    assert json.loads(json_out)["wait"] is None


def test_jobs_show_says_when_nobody_serves_the_queue(db, run):
    report = _job(db, rl.JobStatus.PENDING, REPORT)

    shown = fields(run("jobs", "show", str(report.id))[1])

    assert shown["waits"] == "no_worker: no live worker serves queue 'default' and type 'q.report'"


def test_stats_shows_the_queues_with_their_limits_and_waiting_counts(db, run):
    rl.pause_queue(db, "mail")

    code, out, _ = run("stats")
    _, json_out, _ = run("stats", "--json")

    assert code == 0
    queues_block = out.split("\n\n")[2]
    assert table(queues_block)["mail"] == {"queue": "mail", "paused": "yes", "global_limit": "4", "key_limit": "1",
                                           "rate_limit": "100/60s", "ready": "2", "held_by_key": "1",
                                           "scheduled": "1", "leased": "1"}
    mail = {queue["name"]: queue for queue in json.loads(json_out)["queues"]}["mail"]
    assert (mail["paused"], mail["ready"], mail["blocked_by_key"], mail["global_limit"]) == (True, 2, 1, 4)
    assert SECRET not in out + json_out


def test_top_once_shows_the_queues_with_their_state(db, run):
    rl.pause_queue(db, "mail")

    code, out, _ = run("top", "--once")

    assert code == 0
    rows = {cells[0]: cells for cells in (
        [cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]] for line in out.splitlines()) if cells}
    assert rows["queue"] == ["queue", "state", "global limit", "key limit", "rate limit", "ready", "held by key",
                             "scheduled", "leased"]
    assert rows["mail"] == ["mail", "paused", "4", "1", "100/60s", "2", "1", "1", "1"]
    assert rows["default"][:2] == ["default", "active"]


def test_migrate_refuses_an_app_whose_handler_names_an_undeclared_queue_and_guesses_the_name(engine, run):
    code, out, err = run("migrate", "--app", "tests.cli_app:queue_typo")

    first, hint = err.splitlines()[:2]
    assert (code, out) == (1, "")
    assert first.startswith("error: registry.undeclared_queue: job type 'cli.mail' names queue 'mial'")
    assert "did you mean 'mail'?" in first and hint.startswith("hint: fix the queue's name")
    assert [queue.name for queue in rl.list_queues(engine)] == ["default"]
