"""Cron parsing and the next-fire rule (spec section 8): forms, weekdays, zones, jitter."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from runledger_sync.core import errors
from runledger_sync.core.cron import jitter_seconds, next_fire_at, parse_cron

UTC = timezone.utc
BERLIN_SPRING_FORWARD = datetime(2026, 3, 29, tzinfo=UTC)  # 02:00 CET -> 03:00 CEST
BERLIN_FALL_BACK = datetime(2026, 10, 25, tzinfo=UTC)  # 03:00 CEST -> 02:00 CET


def fires(expression: str, after: datetime, count: int, zone: str = "UTC") -> list[datetime]:
    schedule = parse_cron(expression, zone)
    found = []
    for _ in range(count):
        after = schedule.next_fire(after)
        found.append(after)
    return found


@pytest.mark.parametrize(("expression", "expected"), [
    ("0 30 9 * * *", "2026-12-04T09:30:00"),        # Runledger form: seconds first
    ("15 30 9 * * * *", "2026-12-04T09:30:15"),     # with a year field
    ("30 9 * * *", "2026-12-04T09:30:00"),          # crontab form: second 0
    ("@hourly", "2026-12-04T09:00:00"),
    ("@daily", "2026-12-05T00:00:00"),
    ("@weekly", "2026-12-06T00:00:00"),             # a Sunday
    ("@monthly", "2027-01-01T00:00:00"),
    ("@yearly", "2027-01-01T00:00:00"),
])
def test_every_form_names_its_first_time_strictly_after_now(expression, expected):
    [first] = fires(expression, datetime(2026, 12, 4, 8, 59, 59, tzinfo=UTC), 1)
    assert first == datetime.fromisoformat(expected).replace(tzinfo=UTC)


def test_an_instant_that_matches_now_exactly_is_not_next():
    now = datetime(2026, 12, 4, 9, 30, tzinfo=UTC)
    assert fires("0 30 9 * * *", now, 1) == [now + timedelta(days=1)]


@pytest.mark.parametrize(("runledger", "crontab"), [
    ("0 0 0 * * 2", "0 0 * * 1"),        # Monday: 2 in Runledger's numbering, 1 in crontab's
    ("0 0 0 * * 1", "0 0 * * 0"),        # Sunday
    ("0 0 0 * * 7", "0 0 * * 6"),        # Saturday
    ("0 0 0 * * 2-6", "0 0 * * 1-5"),    # weekdays
    ("0 0 0 * * 1-7/2", "0 0 * * 0-6/2"),
    ("0 0 0 * * MON,FRI", "0 0 * * MON,FRI"),
])
def test_weekday_numbers_follow_each_forms_own_numbering(runledger, crontab):
    after = datetime(2026, 12, 1, tzinfo=UTC)
    assert fires(runledger, after, 6) == fires(crontab, after, 6)


def test_a_daily_time_in_the_spring_forward_gap_fires_once_that_day():
    days = fires("0 30 2 * * *", BERLIN_SPRING_FORWARD - timedelta(days=1), 3, "Europe/Berlin")
    local = [d.astimezone(parse_cron("@daily", "Europe/Berlin").zone) for d in days]
    assert [d.date().isoformat() for d in local] == ["2026-03-28", "2026-03-29", "2026-03-30"]
    # 02:30 does not exist on the 29th: it fires as far after the gap as it was into it.
    assert [d.strftime("%H:%M%z") for d in local] == ["02:30+0100", "03:30+0200", "02:30+0200"]


def test_a_daily_time_in_the_repeated_hour_fires_once_on_the_fall_back_day():
    days = fires("0 30 2 * * *", BERLIN_FALL_BACK - timedelta(days=1), 3, "Europe/Berlin")
    local = [d.astimezone(parse_cron("@daily", "Europe/Berlin").zone) for d in days]
    assert [d.date().isoformat() for d in local] == ["2026-10-24", "2026-10-25", "2026-10-26"]
    assert [d.strftime("%H:%M%z") for d in local] == ["02:30+0200", "02:30+0200", "02:30+0100"]


def test_fires_are_strictly_increasing_through_both_changes():
    for day in (BERLIN_SPRING_FORWARD, BERLIN_FALL_BACK):
        found = fires("0 */15 * * * *", day, 24, "Europe/Berlin")
        assert found == sorted(found)
        assert len(set(found)) == 24


def test_a_zone_moves_the_wall_time():
    # Midnight UTC is 09:00 in Tokyo: the next 09:00 there is a day later, at 00:00 UTC.
    assert fires("0 0 9 * * *", datetime(2026, 12, 4, tzinfo=UTC), 1) == [datetime(2026, 12, 4, 9, tzinfo=UTC)]
    assert fires("0 0 9 * * *", datetime(2026, 12, 4, tzinfo=UTC), 1, "Asia/Tokyo") == [
        datetime(2026, 12, 5, tzinfo=UTC)]


@pytest.mark.parametrize(("expression", "names"), [
    ("0 61 * * * *", "minute field '61'"),
    ("0 0 25 * * *", "hour field '25'"),
    ("0 0 0 32 * *", "day of month field '32'"),
    ("0 0 0 * 13 *", "month field '13'"),
    ("61 * * * * *", "second field '61'"),
    ("0 0 0 * * 8", "day of week 8 is out of range"),
    ("0 0 0 * * 0", "day of week 0 is out of range"),
    ("* * *", "has 3 fields"),
    ("1 2 3 4 5 6 7 8", "has 8 fields"),
    ("@fortnightly", "unknown cron nickname"),
    ("0 0 0 1 1 * 2020", "names no time after"),
    ("", "non-blank"),
])
def test_a_bad_expression_is_refused_naming_what_is_wrong(expression, names):
    with pytest.raises(errors.InvalidCron) as caught:
        parse_cron(expression).next_fire(datetime(2026, 12, 4, tzinfo=UTC))
    assert caught.value.code == "schedule.invalid_cron"
    assert names in caught.value.message


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", None, "UTC" * 30])
def test_an_unknown_zone_is_refused(zone):
    with pytest.raises(errors.InvalidTimezone) as caught:
        parse_cron("@daily", zone)
    assert caught.value.code == "schedule.invalid_timezone"


def test_jitter_is_deterministic_per_schedule_and_instant_and_within_its_bound():
    schedule = parse_cron("0 * * * * *")
    ids = [uuid.UUID(int=n * 7919 + 1) for n in range(50)]
    instants = fires("0 * * * * *", datetime(2026, 12, 4, tzinfo=UTC), 20)
    seen = set()
    for schedule_id in ids:
        for instant in instants:
            jitter = jitter_seconds(schedule_id, instant, 30)
            assert 0 <= jitter <= 30
            assert jitter == jitter_seconds(schedule_id, instant, 30)
            seen.add(jitter)
            expected = instant + timedelta(seconds=jitter)
            assert next_fire_at(schedule, schedule_id, 30, instant - timedelta(seconds=1)) == expected
    assert len(seen) > 20  # spread over the window, not one value
    assert jitter_seconds(ids[0], instants[0], 0) == 0
