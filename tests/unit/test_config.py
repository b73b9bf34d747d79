"""JobsConfig: defaults, validation messages, environment parsing and clamps."""

from __future__ import annotations

import dataclasses
import logging
import re
import threading

import pytest

from runledger_sync import config as config_module
from runledger_sync.config import JobsConfig
from runledger_sync.core.errors import ConfigError
from runledger_sync.core.types import EventLog, RuntimeLoopExit
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.worker.loop import run_worker_loop

WORKER_ID_PATTERN = re.compile(
    r"^worker-[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
)


def problems_of(config: JobsConfig, method: str = "validate") -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        getattr(config, method)()
    assert excinfo.value.code == "config.invalid"
    return excinfo.value.problems


# --- defaults -------------------------------------------------------------------


def test_defaults_match_the_spec():
    config = JobsConfig()
    assert config.poll_interval_ms == 500
    assert config.claim_batch_size == 16
    assert config.lease_ttl_seconds == 60
    assert config.max_global_concurrency == 32
    assert config.reaper_interval_seconds == 15
    assert config.schedule_poll_interval_seconds == 30
    assert config.reaper_retry_delay_ms == 30_000
    assert config.heartbeat_interval_seconds is None
    assert config.timeout_grace_seconds == 5.0
    assert config.dead_letter_hook_timeout_seconds == 10.0
    assert config.heartbeat_lock_timeout_ms == 5_000
    assert config.max_payload_bytes == 1_048_576
    assert config.job_types is None
    assert config.log_payloads is False


def test_default_constants_sit_beside_the_fields():
    for f in dataclasses.fields(JobsConfig):
        if f.name == "worker_id":
            continue
        assert getattr(config_module, f"DEFAULT_{f.name.upper()}") == f.default, f.name


def test_default_worker_id_is_generated_per_config():
    a, b = JobsConfig(), JobsConfig()
    assert WORKER_ID_PATTERN.match(a.worker_id)
    assert a.worker_id != b.worker_id


def test_defaults_validate():
    config = JobsConfig()
    assert config.validate() is config


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        JobsConfig().claim_batch_size = 3  # type: ignore[misc]


def test_heartbeat_interval_defaults_to_a_third_of_the_lease():
    assert JobsConfig().heartbeat_interval == 20
    assert JobsConfig(lease_ttl_seconds=10).heartbeat_interval == 3
    assert JobsConfig(lease_ttl_seconds=2).heartbeat_interval == 1
    assert JobsConfig(lease_ttl_seconds=10, heartbeat_interval_seconds=0.2).heartbeat_interval == 0.2


def test_with_overrides_replaces_only_the_named_fields():
    base = JobsConfig(worker_id="w1")
    changed = base.with_overrides(poll_interval_ms=10, claim_batch_size=2)
    assert (changed.worker_id, changed.poll_interval_ms, changed.claim_batch_size) == ("w1", 10, 2)
    assert base.poll_interval_ms == 500
    with pytest.raises(TypeError):
        base.with_overrides(no_such_field=1)


def test_job_types_list_becomes_a_tuple():
    assert JobsConfig(job_types=["a", "b"]).job_types == ("a", "b")


# --- validate -------------------------------------------------------------------


def test_validate_reports_every_problem_at_once_with_field_and_value():
    config = JobsConfig(
        worker_id="  ",
        poll_interval_ms=0,
        claim_batch_size=1001,
        lease_ttl_seconds=0.5,
        max_global_concurrency=0,
        reaper_interval_seconds=-1,
        schedule_poll_interval_seconds=0,
        reaper_retry_delay_ms=0,
        heartbeat_interval_seconds=0,
        timeout_grace_seconds=-0.1,
        dead_letter_hook_timeout_seconds=0,
        heartbeat_lock_timeout_ms=0,
        max_payload_bytes=0,
        job_types=("ok", " "),
        log_payloads="yes",  # type: ignore[arg-type]
    )
    assert problems_of(config) == [
        "jobs config worker_id must be a non-blank string, got '  '",
        "jobs config poll_interval_ms must be > 0, got 0",
        "jobs config claim_batch_size must be between 1 and 1000, got 1001",
        "jobs config lease_ttl_seconds must be >= 1, got 0.5",
        "jobs config max_global_concurrency must be >= 1, got 0",
        "jobs config reaper_interval_seconds must be > 0, got -1",
        "jobs config schedule_poll_interval_seconds must be > 0, got 0",
        "jobs config reaper_retry_delay_ms must be >= 1, got 0",
        "jobs config heartbeat_interval_seconds must be > 0 when set, got 0",
        "jobs config timeout_grace_seconds must be >= 0, got -0.1",
        "jobs config dead_letter_hook_timeout_seconds must be > 0, got 0",
        "jobs config heartbeat_lock_timeout_ms must be >= 1, got 0",
        "jobs config max_payload_bytes must be >= 1, got 0",
        "jobs config job_types must be None or a non-empty tuple of non-blank job type strings, got ('ok', ' ')",
        "jobs config log_payloads must be a bool, got 'yes'",
    ]


def test_config_error_message_joins_the_problems():
    with pytest.raises(ConfigError) as excinfo:
        JobsConfig(claim_batch_size=0, max_global_concurrency=0).validate()
    assert str(excinfo.value) == (
        "config.invalid: jobs config claim_batch_size must be between 1 and 1000, got 0; "
        "jobs config max_global_concurrency must be >= 1, got 0"
    )


def test_direct_construction_is_looser_than_the_env_clamps():
    # TTL 1 s and a 1 ms reaper delay would be clamped from the environment.
    JobsConfig(
        lease_ttl_seconds=1, reaper_retry_delay_ms=1, poll_interval_ms=0.5, claim_batch_size=1000
    ).validate()


@pytest.mark.parametrize(
    ("field_name", "value", "message"),
    [
        ("claim_batch_size", True, "jobs config claim_batch_size must be an integer, got True (bool)"),
        ("claim_batch_size", 16.0, "jobs config claim_batch_size must be an integer, got 16.0 (float)"),
        (
            "max_global_concurrency",
            "32",
            "jobs config max_global_concurrency must be an integer, got '32' (str)",
        ),
        ("poll_interval_ms", False, "jobs config poll_interval_ms must be a finite number, got False (bool)"),
        ("poll_interval_ms", "500", "jobs config poll_interval_ms must be a finite number, got '500' (str)"),
        (
            "lease_ttl_seconds",
            float("inf"),
            "jobs config lease_ttl_seconds must be a finite number, got inf (float)",
        ),
        (
            "timeout_grace_seconds",
            None,
            "jobs config timeout_grace_seconds must be a finite number, got None (NoneType)",
        ),
        ("worker_id", 7, "jobs config worker_id must be a non-blank string, got 7"),
        (
            "job_types",
            "a,b",
            "jobs config job_types must be None or a non-empty tuple of non-blank job type strings, got 'a,b'",
        ),
        (
            "job_types",
            (),
            "jobs config job_types must be None or a non-empty tuple of non-blank job type strings, got ()",
        ),
    ],
)
def test_wrong_types_get_a_message_not_a_type_error(field_name, value, message):
    assert problems_of(JobsConfig(**{field_name: value})) == [message]


def test_heartbeat_interval_must_be_shorter_than_the_lease():
    assert problems_of(JobsConfig(lease_ttl_seconds=10, heartbeat_interval_seconds=10)) == [
        "jobs config heartbeat_interval_seconds must be < lease_ttl_seconds (10) when set, got 10"
    ]
    JobsConfig(lease_ttl_seconds=10, heartbeat_interval_seconds=9.9).validate()


def test_broken_lease_is_reported_once_not_again_through_heartbeat():
    assert problems_of(JobsConfig(lease_ttl_seconds="x", heartbeat_interval_seconds=5)) == [  # type: ignore[arg-type]
        "jobs config lease_ttl_seconds must be a finite number, got 'x' (str)"
    ]


# --- subset validators ----------------------------------------------------------


def test_worker_loop_checks_only_worker_fields():
    config = JobsConfig(
        worker_id="", reaper_retry_delay_ms=0, schedule_poll_interval_seconds=0, max_payload_bytes=0
    )
    assert problems_of(config, "validate_worker_loop") == [
        "jobs config worker_id must be a non-blank string, got ''"
    ]


def test_unknown_job_types_stop_the_worker_loop_with_one_readable_problem(caplog):
    registry = JobRegistry()
    registry.job("test.job")(lambda ctx, payload: None)
    caplog.set_level(logging.WARNING, logger="runledger_sync")
    config = JobsConfig(job_types=("test.job", "test.tpyo"))
    # The check runs before the engine is touched, so none is needed.
    assert run_worker_loop(None, registry, config, threading.Event()) is RuntimeLoopExit.INVALID_CONFIG
    [record] = [r for r in caplog.records if r.getMessage() == "invalid jobs config; stopping worker loop"]
    assert record.error == (
        "config.invalid: jobs config job_types names types no handler is registered for: test.tpyo; registered: test.job")


def test_reaper_checks_batch_interval_delay_and_hook_timeout():
    config = JobsConfig(
        worker_id="",
        poll_interval_ms=0,
        claim_batch_size=0,
        reaper_interval_seconds=0,
        reaper_retry_delay_ms=0,
        dead_letter_hook_timeout_seconds=0,
        schedule_poll_interval_seconds=0,
    )
    assert problems_of(config, "validate_reaper") == [
        "jobs config claim_batch_size must be between 1 and 1000, got 0",
        "jobs config reaper_interval_seconds must be > 0, got 0",
        "jobs config reaper_retry_delay_ms must be >= 1, got 0",
        "jobs config dead_letter_hook_timeout_seconds must be > 0, got 0",
    ]


def test_scheduler_checks_batch_and_schedule_poll():
    config = JobsConfig(
        worker_id="", claim_batch_size=0, schedule_poll_interval_seconds=0, reaper_interval_seconds=0
    )
    assert problems_of(config, "validate_scheduler") == [
        "jobs config claim_batch_size must be between 1 and 1000, got 0",
        "jobs config schedule_poll_interval_seconds must be > 0, got 0",
    ]


def test_worker_loop_reports_all_its_problems():
    config = JobsConfig(
        worker_id="w",
        poll_interval_ms=0,
        claim_batch_size=0,
        lease_ttl_seconds=0,
        max_global_concurrency=0,
        heartbeat_interval_seconds=-1,
        timeout_grace_seconds=-1,
        dead_letter_hook_timeout_seconds=0,
    )
    fields = [p.split()[2] for p in problems_of(config, "validate_worker_loop")]
    assert fields == [
        "poll_interval_ms",
        "claim_batch_size",
        "lease_ttl_seconds",
        "max_global_concurrency",
        "heartbeat_interval_seconds",
        "timeout_grace_seconds",
        "dead_letter_hook_timeout_seconds",
    ]


def test_subset_validators_pass_on_valid_subsets_and_return_the_config():
    config = JobsConfig(worker_id="")  # only the worker cares about the id
    assert config.validate_reaper() is config
    assert config.validate_scheduler() is config


# --- from_env -------------------------------------------------------------------


def test_from_env_with_nothing_set_gives_defaults():
    config = JobsConfig.from_env({})
    assert dataclasses.replace(config, worker_id="x") == JobsConfig(worker_id="x")
    assert WORKER_ID_PATTERN.match(config.worker_id)


def test_from_env_reads_every_runledger_variable():
    config = JobsConfig.from_env(
        {
            "RUNLEDGER_WORKER_ID": "  host-1  ",
            "RUNLEDGER_POLL_INTERVAL_MS": "250",
            "RUNLEDGER_CLAIM_BATCH_SIZE": "8",
            "RUNLEDGER_LEASE_TTL_SECONDS": "45.5",
            "RUNLEDGER_MAX_GLOBAL_CONCURRENCY": "4",
            "RUNLEDGER_REAPER_INTERVAL_SECONDS": "7",
            "RUNLEDGER_SCHEDULE_POLL_INTERVAL_SECONDS": "9",
            "RUNLEDGER_REAPER_RETRY_DELAY_MS": "2000",
            "RUNLEDGER_HEARTBEAT_INTERVAL_SECONDS": "1.5",
            "RUNLEDGER_TIMEOUT_GRACE_SECONDS": "0",
            "RUNLEDGER_DEAD_LETTER_HOOK_TIMEOUT_SECONDS": "0.1",
            "RUNLEDGER_HEARTBEAT_LOCK_TIMEOUT_MS": "750",
            "RUNLEDGER_MAX_PAYLOAD_BYTES": "1024",
            "RUNLEDGER_JOB_TYPES": " email.send, ,reports.export ",
            "RUNLEDGER_LOG_PAYLOADS": "TRUE",
        }
    )
    assert config == JobsConfig(
        worker_id="host-1",
        poll_interval_ms=250,
        claim_batch_size=8,
        lease_ttl_seconds=45.5,
        max_global_concurrency=4,
        reaper_interval_seconds=7,
        schedule_poll_interval_seconds=9,
        reaper_retry_delay_ms=2000,
        heartbeat_interval_seconds=1.5,
        timeout_grace_seconds=0,
        dead_letter_hook_timeout_seconds=0.1,
        heartbeat_lock_timeout_ms=750,
        max_payload_bytes=1024,
        job_types=("email.send", "reports.export"),
        log_payloads=True,
    )
    config.validate()


def test_from_env_accepts_the_rust_jobs_names():
    config = JobsConfig.from_env(
        {
            "JOBS_WORKER_ID": "rust-name",
            "JOBS_POLL_INTERVAL_MS": "100",
            "JOBS_CLAIM_BATCH_SIZE": "3",
            "JOBS_LEASE_TTL_SECONDS": "30",
            "JOBS_MAX_GLOBAL_CONCURRENCY": "5",
            "JOBS_REAPER_INTERVAL_SECONDS": "2",
            "JOBS_SCHEDULE_POLL_INTERVAL_SECONDS": "4",
            "JOBS_REAPER_RETRY_DELAY_MS": "5000",
        }
    )
    assert (
        config.worker_id,
        config.poll_interval_ms,
        config.claim_batch_size,
        config.lease_ttl_seconds,
        config.max_global_concurrency,
        config.reaper_interval_seconds,
        config.schedule_poll_interval_seconds,
        config.reaper_retry_delay_ms,
    ) == ("rust-name", 100, 3, 30, 5, 2, 4, 5000)


def test_runledger_name_wins_over_jobs_alias():
    config = JobsConfig.from_env(
        {"RUNLEDGER_CLAIM_BATCH_SIZE": "7", "JOBS_CLAIM_BATCH_SIZE": "9", "JOBS_WORKER_ID": "alias"}
    )
    assert config.claim_batch_size == 7
    assert config.worker_id == "alias"


def test_blank_runledger_value_falls_through_to_the_alias():
    assert (
        JobsConfig.from_env(
            {"RUNLEDGER_CLAIM_BATCH_SIZE": " ", "JOBS_CLAIM_BATCH_SIZE": "9"}
        ).claim_batch_size
        == 9
    )


def test_only_the_eight_rust_fields_and_event_log_have_aliases():
    assert JobsConfig.from_env({"JOBS_TIMEOUT_GRACE_SECONDS": "1"}).timeout_grace_seconds == 5.0


@pytest.mark.parametrize(
    ("variable", "raw", "field_name", "expected"),
    [
        ("JOBS_POLL_INTERVAL_MS", "0", "poll_interval_ms", 1),
        ("JOBS_POLL_INTERVAL_MS", "0.25", "poll_interval_ms", 1),
        ("JOBS_CLAIM_BATCH_SIZE", "0", "claim_batch_size", 1),
        ("JOBS_CLAIM_BATCH_SIZE", "-4", "claim_batch_size", 1),
        ("JOBS_CLAIM_BATCH_SIZE", "5000", "claim_batch_size", 1000),
        ("JOBS_LEASE_TTL_SECONDS", "3", "lease_ttl_seconds", 10),
        ("JOBS_MAX_GLOBAL_CONCURRENCY", "0", "max_global_concurrency", 1),
        ("JOBS_REAPER_INTERVAL_SECONDS", "0", "reaper_interval_seconds", 1),
        ("JOBS_SCHEDULE_POLL_INTERVAL_SECONDS", "0.5", "schedule_poll_interval_seconds", 1),
        ("JOBS_REAPER_RETRY_DELAY_MS", "10", "reaper_retry_delay_ms", 1000),
        ("RUNLEDGER_LEASE_TTL_SECONDS", "9.99", "lease_ttl_seconds", 10),
    ],
)
def test_from_env_clamps_to_the_spec_ranges(variable, raw, field_name, expected):
    config = JobsConfig.from_env({variable: raw})
    assert getattr(config, field_name) == expected
    config.validate()


def test_values_inside_the_clamps_are_kept():
    config = JobsConfig.from_env({"JOBS_LEASE_TTL_SECONDS": "10", "JOBS_CLAIM_BATCH_SIZE": "1000"})
    assert (config.lease_ttl_seconds, config.claim_batch_size) == (10, 1000)


@pytest.mark.parametrize(
    ("variable", "raw", "field_name"),
    [
        ("JOBS_POLL_INTERVAL_MS", "fast", "poll_interval_ms"),
        ("JOBS_CLAIM_BATCH_SIZE", "16.5", "claim_batch_size"),
        ("RUNLEDGER_LEASE_TTL_SECONDS", "nan", "lease_ttl_seconds"),
        ("RUNLEDGER_MAX_GLOBAL_CONCURRENCY", "lots", "max_global_concurrency"),
        ("RUNLEDGER_REAPER_RETRY_DELAY_MS", "1e3x", "reaper_retry_delay_ms"),
        ("RUNLEDGER_LOG_PAYLOADS", "maybe", "log_payloads"),
        ("RUNLEDGER_HEARTBEAT_INTERVAL_SECONDS", "inf", "heartbeat_interval_seconds"),
        ("RUNLEDGER_JOB_TYPES", " , ,", "job_types"),
        ("JOBS_EVENT_LOG", "quiet", "event_log"),
    ],
)
def test_unparseable_value_falls_back_to_default_and_is_recorded(caplog, variable, raw, field_name):
    caplog.set_level(logging.DEBUG, logger="runledger_sync")
    config = JobsConfig.from_env({variable: raw})
    default = getattr(JobsConfig, field_name)
    assert getattr(config, field_name) == default
    [adjustment] = config.env_adjustments
    assert (adjustment.variable, adjustment.field, adjustment.given, adjustment.used) == (
        variable, field_name, raw.strip(), default)
    assert adjustment.is_default
    assert adjustment.describe().startswith(f"{variable}={raw.strip()!r} ")
    assert "using the default" in adjustment.describe()
    # Reported once, by the worker at start, not on every from_env() call.
    assert caplog.records == []


def test_a_clamped_value_is_recorded_with_the_value_used_and_why():
    config = JobsConfig.from_env({"JOBS_LEASE_TTL_SECONDS": "3", "JOBS_CLAIM_BATCH_SIZE": "5000"})

    assert [a.describe() for a in config.env_adjustments] == [
        "JOBS_CLAIM_BATCH_SIZE='5000' is above the maximum of 1000; using 1000 instead",
        "JOBS_LEASE_TTL_SECONDS='3' is below the minimum of 10; using 10 instead",
    ]
    assert config.env_adjustments[1].log_fields() == {
        "variable": "JOBS_LEASE_TTL_SECONDS", "given": "3", "used": 10, "reason": "is below the minimum of 10"}


def test_the_issue_examples_are_each_recorded():
    config = JobsConfig.from_env({"JOBS_MAX_GLOBAL_CONCURRENCY": "abc", "JOBS_POLL_INTERVAL_MS": "0"})

    assert (config.max_global_concurrency, config.poll_interval_ms) == (32, 1)
    assert [a.describe() for a in config.env_adjustments] == [
        "JOBS_POLL_INTERVAL_MS='0' is below the minimum of 1; using 1 instead",
        "JOBS_MAX_GLOBAL_CONCURRENCY='abc' is not a whole number; using the default, 32",
    ]


def test_values_used_as_given_record_nothing():
    config = JobsConfig.from_env({"JOBS_POLL_INTERVAL_MS": "250", "RUNLEDGER_JOB_TYPES": "a,b"})

    assert config.env_adjustments == ()
    assert JobsConfig().env_adjustments == ()


def test_strict_from_env_refuses_every_adjusted_value_at_once():
    env = {"JOBS_MAX_GLOBAL_CONCURRENCY": "abc", "JOBS_POLL_INTERVAL_MS": "0", "JOBS_CLAIM_BATCH_SIZE": "8"}

    with pytest.raises(ConfigError) as caught:
        JobsConfig.from_env(env, strict=True)

    assert caught.value.problems == [
        "JOBS_POLL_INTERVAL_MS='0' is below the minimum of 1",
        "JOBS_MAX_GLOBAL_CONCURRENCY='abc' is not a whole number",
    ]
    assert JobsConfig.from_env({"JOBS_CLAIM_BATCH_SIZE": "8"}, strict=True).claim_batch_size == 8


def test_an_override_drops_the_adjustment_of_the_field_it_replaces():
    config = JobsConfig.from_env({"JOBS_MAX_GLOBAL_CONCURRENCY": "abc", "JOBS_POLL_INTERVAL_MS": "0"})

    overridden = config.with_overrides(poll_interval_ms=100)

    assert [a.variable for a in overridden.env_adjustments] == ["JOBS_MAX_GLOBAL_CONCURRENCY"]
    # A record of where values came from, not a knob: equality and fields() ignore it.
    assert overridden == JobsConfig(worker_id=config.worker_id, poll_interval_ms=100)
    assert "env_adjustments" not in {f.name for f in dataclasses.fields(JobsConfig)}


@pytest.mark.parametrize("raw", ["", "   "])
def test_blank_worker_id_from_env_is_generated(raw):
    config = JobsConfig.from_env({"RUNLEDGER_WORKER_ID": raw, "JOBS_WORKER_ID": raw})
    assert WORKER_ID_PATTERN.match(config.worker_id)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("yes", True), ("On", True), ("0", False), ("false", False), ("off", False)],
)
def test_log_payloads_parses_common_booleans(raw, expected):
    assert JobsConfig.from_env({"RUNLEDGER_LOG_PAYLOADS": raw}).log_payloads is expected


def test_from_env_does_not_validate_unclamped_knobs():
    config = JobsConfig.from_env({"RUNLEDGER_TIMEOUT_GRACE_SECONDS": "-1"})
    assert config.timeout_grace_seconds == -1
    assert problems_of(config) == ["jobs config timeout_grace_seconds must be >= 0, got -1"]


def test_from_env_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("RUNLEDGER_CLAIM_BATCH_SIZE", "11")
    monkeypatch.delenv("JOBS_CLAIM_BATCH_SIZE", raising=False)
    assert JobsConfig.from_env().claim_batch_size == 11


# -- event_log ---------------------------------------------------------------------


def test_event_log_defaults_to_transitions():
    assert JobsConfig().event_log == EventLog.TRANSITIONS == "transitions"
    assert JobsConfig.from_env({}).event_log == "transitions"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"RUNLEDGER_EVENT_LOG": "transitions"}, "transitions"),
        ({"JOBS_EVENT_LOG": " Transitions "}, "transitions"),
        ({"RUNLEDGER_EVENT_LOG": "full", "JOBS_EVENT_LOG": "transitions"}, "full"),
    ],
)
def test_event_log_is_read_from_the_environment(environ, expected):
    config = JobsConfig.from_env(environ)
    assert (config.event_log, config.env_adjustments) == (expected, ())
    config.validate()


def test_strict_from_env_refuses_an_unknown_event_log():
    with pytest.raises(ConfigError) as refused:
        JobsConfig.from_env({"RUNLEDGER_EVENT_LOG": "none"}, strict=True)
    assert refused.value.code == "config.invalid"
    assert refused.value.problems == [
        "RUNLEDGER_EVENT_LOG='none' is not an event log level (expected full or transitions)"
    ]


@pytest.mark.parametrize("value", ["FULL", "", None, True, "transition"])
def test_validate_refuses_an_unknown_event_log(value):
    with pytest.raises(ConfigError) as refused:
        JobsConfig(event_log=value).validate_worker_loop()
    assert refused.value.problems == [f"jobs config event_log must be one of 'full', 'transitions', got {value!r}"]


def test_validate_accepts_either_level_as_enum_or_text():
    for value in (EventLog.FULL, EventLog.TRANSITIONS, "full", "transitions"):
        assert JobsConfig(event_log=value).validate().event_log == value


def test_retention_is_on_by_default_and_read_from_the_environment():
    from datetime import timedelta

    from runledger_sync.core.retention import Retention

    assert JobsConfig().retention == Retention(
        succeeded=timedelta(days=7), canceled=timedelta(days=7),
        dead_lettered=timedelta(days=30), workflow_runs=timedelta(days=30))
    assert JobsConfig.from_env({"RUNLEDGER_RETENTION": "off"}).retention is None
    read = JobsConfig.from_env({"RUNLEDGER_RETENTION": "succeeded=12h,dead_lettered=keep"}).retention
    assert read == Retention(succeeded=timedelta(hours=12), dead_lettered=None)
    bent = JobsConfig.from_env({"RUNLEDGER_RETENTION": "forever-ish"})
    assert bent.retention == Retention() and bent.env_adjustments[0].field == "retention"
    with pytest.raises(ConfigError, match="RUNLEDGER_RETENTION"):
        JobsConfig.from_env({"RUNLEDGER_RETENTION": "forever-ish"}, strict=True)


def test_retention_and_the_prune_interval_are_validated():
    with pytest.raises(ConfigError) as refused:
        JobsConfig(retention={"succeeded": 1}, prune_interval_seconds=0).validate_pruner()  # type: ignore[arg-type]
    assert len(refused.value.problems) == 2
    assert JobsConfig(retention=None).validate() is not None
