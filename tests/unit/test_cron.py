"""Cron parsing and the next-fire rule (spec section 8): forms, weekdays, zones, jitter."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Optional

import pytest

from runledger_sync.core import errors
from runledger_sync.core.cron import jitter_seconds, next_fire_at, parse_cron

UTC = timezone.utc
BERLIN_SPRING_FORWARD = datetime(2026, 3, 29, tzinfo=UTC)  # 02:00 CET -> 03:00 CEST
BERLIN_FALL_BACK = datetime(2026, 10, 25, tzinfo=UTC)  # 03:00 CEST -> 02:00 CET


def fires(expression: str, after: datetime, count: int, zone: str = "UTC") -> list[Optional[datetime]]:
    schedule = parse_cron(expression, zone)
    found: list[Optional[datetime]] = []
    for _ in range(count):
        next_fire = None if after is None else schedule.next_fire(after)
        found.append(next_fire)
        after = next_fire
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
    ("", "non-blank"),
    # Marks croniter would read surprisingly.
    ("0 0 0 15 * 6#2", "needs day of month * or ?"),   # croniter would ask for both: never, here
    ("0 0 0 1-7 * L6", "needs day of month * or ?"),
    ("0 0 0 * * 2-6L", "the last weekday of the month is one day"),
    ("0 0 0 * * L6#2", "the last weekday of the month is one day"),
    ("? 0 0 * * *", "second field '?'"),
    ("0 0 0 * * L", "day of week field 'L'"),
])
def test_a_bad_expression_is_refused_naming_what_is_wrong(expression, names):
    with pytest.raises(errors.InvalidCron) as caught:
        parse_cron(expression)
    assert caught.value.code == "schedule.invalid_cron"
    assert names in caught.value.message


def test_a_year_field_ends_the_instants_after_its_last_year():
    schedule = parse_cron("0 0 0 1 1 * 2027")
    assert schedule.next_fire(datetime(2026, 12, 4, tzinfo=UTC)) == datetime(2027, 1, 1, tzinfo=UTC)
    assert schedule.next_fire(datetime(2027, 1, 1, tzinfo=UTC)) is None
    assert next_fire_at(schedule, uuid.UUID(int=1), 30, datetime(2027, 1, 1, tzinfo=UTC)) is None


@pytest.mark.parametrize(("expression", "names"), [
    ("*/99999999999999999999 * * * * *", "second field '*/99999999999999999999': a step is at most 60"),
    ("0 */61 * * * *", "minute field '*/61': a step is at most 60"),
    ("0 0 */25 * * *", "hour field '*/25': a step is at most 24"),
    ("0 0 0 1-31/32 * *", "day of month field '1-31/32': a step is at most 31"),
    ("0 0 0 1 */13 *", "month field '*/13': a step is at most 12"),
    ("0 0 0 * * 1-7/8", "day of week field '1-7/8': a step is at most 7"),
    ("*/5 */0 * * * *", "minute field '*/0': a step is at least 1"),
    ("0 0 0 1 1 * */231", "year field '*/231': a step is at most 230"),
    ("*/5,10/99 * * * *", "minute field '*/5,10/99': a step is at most 60"),   # the crontab form too
])
def test_a_step_larger_than_its_fields_span_is_refused(expression, names):
    with pytest.raises(errors.InvalidCron) as caught:
        parse_cron(expression)
    assert caught.value.code == "schedule.invalid_cron"
    assert names in caught.value.message


@pytest.mark.parametrize(("expression", "first"), [
    ("*/60 * * * * *", "2026-12-04T00:01:00"),          # the whole span: once a minute, at second 0
    ("0 0 */24 * * *", "2026-12-05T00:00:00"),
    ("0 0 0 1 */12 *", "2027-01-01T00:00:00"),
])
def test_a_step_as_large_as_its_fields_span_names_the_fields_first_value(expression, first):
    assert fires(expression, datetime(2026, 12, 4, tzinfo=UTC), 1) == [datetime.fromisoformat(first).replace(tzinfo=UTC)]


@pytest.mark.parametrize(("expression", "expected"), [
    ("0 0 0 1 1 * 2099", ["2099-01-01T00:00", None]),
    ("0 0 0 1 1 * 2199", ["2199-01-01T00:00", None]),
    ("0 0 0 29 2 * 2100-2199/4", ["2104-02-29T00:00", "2108-02-29T00:00"]),   # 2100 is no leap year
])
def test_years_up_to_2199_are_accepted_and_fire(expression, expected):
    found = fires(expression, datetime(2026, 12, 4, tzinfo=UTC), 2)
    assert [None if at is None else at.strftime("%Y-%m-%dT%H:%M") for at in found] == expected


@pytest.mark.parametrize("expression", ["0 0 0 1 1 * 2200", "0 0 0 1 1 * 2026-2200", "0 0 0 1 1 * 1969"])
def test_a_year_outside_1970_to_2199_is_refused(expression):
    with pytest.raises(errors.InvalidCron, match="year field"):
        parse_cron(expression)


@pytest.mark.parametrize(("expression", "expected"), [
    ("0 0 0 1 1 * 2027-2027", ["2027-01-01T00:00", None, None]),     # the year 2027 only, not every year
    ("0 0 0 1 JAN-JAN *", ["2027-01-01T00:00", "2028-01-01T00:00", "2029-01-01T00:00"]),  # January only
    ("0 0 0 * * MON-MON", ["2026-12-07T00:00", "2026-12-14T00:00", "2026-12-21T00:00"]),  # Mondays only
    ("0 0 0 * * 2-2", ["2026-12-07T00:00", "2026-12-14T00:00", "2026-12-21T00:00"]),      # 2 is Monday here
    ("0 0 9-9 * * *", ["2026-12-06T09:00", "2026-12-07T09:00", "2026-12-08T09:00"]),      # 09:00 only
    ("0 0 0 5-5/2 * *", ["2027-01-05T00:00", "2027-02-05T00:00", "2027-03-05T00:00"]),
])
def test_a_range_whose_ends_are_equal_means_that_one_value(expression, expected):
    found = fires(expression, datetime(2026, 12, 5, 9, 0, tzinfo=UTC), 3)
    assert [None if d is None else d.strftime("%Y-%m-%dT%H:%M") for d in found] == expected


@pytest.mark.parametrize("expression", [
    "0 R 0 * * *", "r 0 0 * * *", "0 0 R(1-5) * * *", "0 0 0 R * *", "0 0 0 1 1 * R", "0 H 0 * * *",
    "0 H(0-29)/5 * * * *", "R 0 * * *",
])
def test_random_and_hashed_values_are_refused(expression):
    with pytest.raises(errors.InvalidCron) as caught:
        parse_cron(expression)
    assert caught.value.code == "schedule.invalid_cron"
    assert "random or hashed value (R or H)" in caught.value.message


@pytest.mark.parametrize(("runledger", "crontab", "expected"), [
    ("0 0 0 L * *", "0 0 L * *", ["2026-12-31", "2027-01-31", "2027-02-28"]),      # last day of the month
    ("0 0 0 ? * 6", "0 0 ? * 5", ["2026-12-11", "2026-12-18", "2026-12-25"]),       # ? means any day of month
    ("0 0 0 * * 6#2", "0 0 * * 5#2", ["2026-12-11", "2027-01-08", "2027-02-12"]),   # second Friday
    ("0 0 0 * * 6L", "0 0 * * 5L", ["2026-12-25", "2027-01-29", "2027-02-26"]),     # last Friday
    ("0 0 0 ? * L6", "0 0 ? * L5", ["2026-12-25", "2027-01-29", "2027-02-26"]),
    ("0 0 0 * * FRIL", "0 0 * * FRIL", ["2026-12-25", "2027-01-29", "2027-02-26"]),
    ("0 0 0 15W * *", "0 0 15W * *", ["2026-12-15", "2027-01-15", "2027-02-15"]),   # nearest weekday
    ("0 0 0 1W 8 *", "0 0 1W 8 *", ["2027-08-02", "2028-08-01", "2029-08-01"]),     # 2027-08-01 is a Sunday
])
def test_last_nth_and_nearest_weekday_marks_follow_each_forms_numbering(runledger, crontab, expected):
    after = datetime(2026, 12, 5, tzinfo=UTC)
    assert [d.date().isoformat() for d in fires(runledger, after, 3)] == expected
    assert fires(crontab, after, 3) == fires(runledger, after, 3)


def test_a_day_of_month_and_a_day_of_week_both_given_match_either_as_in_crontab():
    found = fires("0 0 0 1 * 2", datetime(2026, 12, 5, tzinfo=UTC), 5)  # the 1st, and Mondays
    assert [d.date().isoformat() for d in found] == ["2026-12-07", "2026-12-14", "2026-12-21", "2026-12-28",
                                                     "2027-01-01"]


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", None, "UTC" * 30, "localtime",
                                  "posix/Europe/Berlin", "/etc/localtime"])
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
