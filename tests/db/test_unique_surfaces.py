"""Unique jobs and debounce through every way in: aio, a type's registry default, the CLI, jobs show, the job page."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import runledger_sync as rl
from runledger_sync import aio
from runledger_sync.web import allow_anyone, create_app
from tests.db.aio_support import CALLERS, create_orders
from tests.db.web.conftest import Browser, page
from tests.support import JOB_TYPE, define, rows, scalar


@pytest.fixture(params=CALLERS[:1])
def caller(request, engine, fresh_database) -> Any:
    create_orders(engine)
    kind, driver = request.param
    return lambda: kind(fresh_database, driver)


def test_aio_enqueue_returns_the_live_duplicate_and_debounces_in_the_callers_transaction(caller, engine):
    async def scenario() -> Any:
        async with caller() as transaction:
            first = await aio.enqueue(transaction.bind, JOB_TYPE, {"n": 1}, unique=rl.Unique(key="k"))
            again = await aio.enqueue(transaction.bind, JOB_TYPE, {"n": 2}, unique=rl.Unique(key="k"))
            debounced = [await aio.enqueue(transaction.bind, JOB_TYPE, {"v": v}, debounce=rl.Debounce("d", 5, 60))
                         for v in (1, 2)]
            await transaction.commit()
            return first, again, debounced

    first, again, debounced = asyncio.run(scenario())
    assert (again.id, again.disposition) == (first.id, "existing")
    assert [job.disposition for job in debounced] == ["created", "replaced"]
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 2


def test_a_types_unique_is_the_default_of_its_registry_enqueues(engine):
    registry = rl.JobRegistry()

    @registry.job("sync.account", unique=rl.Unique(period=timedelta(minutes=5)))
    def sync_account(ctx, payload):
        return None

    registry.sync_definitions(engine)
    first = registry.enqueue(engine, "sync.account", {"account": 7})
    again = registry.enqueue(engine, "sync.account", {"account": 7})
    batch = registry.enqueue_many(engine, [rl.JobSpec("sync.account", {"account": 7}),
                                           rl.JobSpec("sync.account", {"account": 8})])
    # An enqueue's own options win: a debounce takes the default's place.
    debounced = registry.enqueue(engine, "sync.account", {"account": 7}, debounce=rl.Debounce("a-7", 5, 60))

    assert (again.id, again.disposition) == (first.id, "existing")
    assert [job.disposition for job in batch] == ["existing", "created"]
    assert debounced.disposition == "created" and debounced.unique_key == "a-7"
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 3


def test_unique_false_switches_a_types_default_off_for_one_call_on_every_path(caller, engine):
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE, unique=rl.Unique(key="one"))
    def handle(ctx, payload):
        return None

    registry.sync_definitions(engine)
    held = registry.enqueue(engine, JOB_TYPE, {"n": 1})
    plain = registry.enqueue(engine, JOB_TYPE, {"n": 2}, unique=False)
    batch = registry.enqueue_many(engine, [rl.JobSpec(JOB_TYPE, {"n": 3}, unique=False),
                                           rl.JobSpec(JOB_TYPE, {"n": 4})])
    direct = rl.enqueue(engine, JOB_TYPE, {"n": 5}, unique=False)

    async def in_transaction() -> Any:
        async with caller() as transaction:
            job = await aio.enqueue(transaction.bind, JOB_TYPE, {"n": 6}, unique=False)
            await transaction.commit()
            return job

    joined = asyncio.run(in_transaction())
    assert [job.disposition for job in (held, plain, *batch, direct, joined)] == [
        "created", "created", "created", "existing", "created", "created"]
    assert batch[1].id == held.id
    # Only the default's job holds the key; the others carry none, so they block nothing later either.
    assert rows(engine, "SELECT payload->>'n', unique_key FROM job_queue ORDER BY payload->>'n'") == [
        ("1", "one"), ("2", None), ("3", None), ("5", None), ("6", None)]


@pytest.mark.parametrize("unique", [rl.Unique(key=" "), "once"])
def test_a_bad_unique_default_is_refused_when_the_type_is_registered(unique):
    registry = rl.JobRegistry()
    with pytest.raises(rl.RegistrationError) as caught:
        registry.job("sync.account", unique=unique)(lambda ctx, payload: None)
    assert caught.value.code == "registry.invalid_registration"
    assert "sync.account" not in registry


def test_the_cli_enqueues_unique_and_debounced_jobs_and_jobs_show_prints_key_and_count(engine, run):
    define(engine)
    first = run("enqueue", JOB_TYPE, "{}", "--unique-key", "k", "--unique-period", "60")
    again = run("enqueue", JOB_TYPE, "{}", "--unique", "--unique-key", "k", "--unique-period", "60")
    debounced = [run("enqueue", JOB_TYPE, "{}", "--debounce", "d", "--debounce-delay", "5", "--debounce-max-delay", "60")
                 for _ in range(3)]

    assert first[0] == 0 and first[1] == again[1]
    assert {out for _, out, _ in debounced} == {debounced[0][1]}
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 2
    code, out, _ = run("jobs", "show", debounced[0][1].strip())
    assert code == 0
    assert "unique_key:          d\n" in out and "debounce_count:      2\n" in out
    assert "disposition" not in out


def test_the_cli_refuses_a_debounce_without_its_delay(engine, run):
    define(engine)
    code, out, err = run("enqueue", JOB_TYPE, "{}", "--debounce", "d")
    assert code == 2 and out == "" and err.startswith("error: job.invalid_debounce")
    assert rows(engine, "SELECT id FROM job_queue") == []


def test_the_job_page_shows_the_unique_key_and_the_debounce_count(engine):
    define(engine)
    unique = rl.enqueue(engine, JOB_TYPE, {}, unique=rl.Unique(key="account-7"))
    for _ in range(3):
        debounced = rl.enqueue(engine, JOB_TYPE, {}, debounce=rl.Debounce("doc-7", 5, 60))
    client = Browser(create_app(engine, authorize=allow_anyone))

    unique_page, debounced_page = page(client, f"/jobs/{unique.id}"), page(client, f"/jobs/{debounced.id}")

    assert 'id="unique-key">account-7 (blocks while PENDING, LEASED)<' in unique_page
    assert 'id="debounce-count">' not in unique_page
    assert 'id="unique-key">doc-7 (blocks while PENDING)<' in debounced_page
    assert 'id="debounce-count">2 times, starts by' in debounced_page
