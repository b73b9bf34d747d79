"""Cron expressions and the next-fire rule of schedules (spec section 8), on croniter.

Three forms are accepted:

- Runledger's, seconds first, 6 or 7 fields: ``sec min hour day month weekday [year]``.
  Its numeric weekdays are those of Runledger's Rust parser, 1-7 for Sunday-Saturday;
  names (``MON``-``SUN``) mean the same in every form.
- The crontab form, 5 fields: ``min hour day month weekday``, firing at second 0,
  with crontab's weekdays 0-7 (0 and 7 are Sunday).
- The nicknames ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily``
  (``@midnight``) and ``@hourly``.

Every accepted expression names the same instants on every machine and at every
write, so some of croniter's readings are refused or corrected here:

- ``R`` (random) and ``H`` (hashed) values are refused: each write would pick
  another time.
- A range whose two ends are equal (``2026-2026``, ``MON-MON``) means that one
  value; croniter reads it as the whole cycle.
- ``?`` is accepted in the day-of-month and day-of-week fields, meaning any.
  ``L`` in day of month is its last day, ``15W`` the weekday nearest the 15th;
  in day of week ``5#2`` is the second and ``5L`` (or ``L5``) the last such
  weekday of the month, numbered as the form numbers weekdays. ``#`` and ``L``
  in day of week need day of month ``*`` or ``?``: croniter would require both.
- As in crontab, a day of month and a day of week both given match either.
- A step (``*/15``) is at most the number of values its field has (60 seconds,
  24 hours, ...): croniter takes any step, even one of twenty digits.
- Years run from 1970 to 2199: croniter's own years end at 2099, so a
  schedule for 2099 could be written today but not found.

Times are wall-clock times in the schedule's IANA time zone. Where a daylight
saving change repeats an hour, a time in it fires once, at its first occurrence;
where the change skips an hour, a time in the gap fires once, as far after the
gap as it was into it (02:30 on a spring-forward night in Berlin fires at 03:30).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Optional
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

from runledger_sync.core.errors import InvalidCron, InvalidTimezone

UTC = timezone.utc
DEFAULT_TIMEZONE = "UTC"
MAX_EXPRESSION_LENGTH = 256

_NICKNAMES = {
    # Already in croniter's own form (seconds first, weekday 0 = Sunday).
    "@yearly": "0 0 0 1 1 *",
    "@annually": "0 0 0 1 1 *",
    "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *",
    "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}
_FIELD_NAMES = ("second", "minute", "hour", "day of month", "month", "day of week", "year")
#: Candidates looked at for one next fire: a per-second schedule skips up to an
#: hour of them in the hour a daylight saving change repeats.
_MAX_CANDIDATES = 10_000
_WEEKDAY_TERM = re.compile(
    r"^(?P<lead>L)?(?P<first>\d+|[A-Z]{3})(?:-(?P<last>\d+|[A-Z]{3}))?(?P<rest>(?:#\d+|L)?)$", re.IGNORECASE)
_EQUAL_RANGE = re.compile(r"^(?P<low>\w+)-(?P<high>\w+)(?:/\d+)?$")
#: croniter's random (R) and hashed (H) values, alone or with a range or step.
_RANDOM_OR_HASHED = re.compile(r"^[RH](?:\(\d+-\d+\))?(?:/\d+)?$", re.IGNORECASE)
_DAY_OF_MONTH, _DAY_OF_WEEK = 3, 5
#: The last year a year field may name.
LAST_YEAR = 2199
#: How many values each field has, in _FIELD_NAMES' order: a step is at most that many.
_FIELD_SPANS = (60, 60, 24, 31, 12, 7, LAST_YEAR - 1970 + 1)
_STEP = re.compile(r"/(?P<step>\d+)$")


class _Croniter(croniter):
    """croniter with years up to :data:`LAST_YEAR`, and matches searched for across all of them.

    croniter stops looking after 50 years without a match, so a year field
    naming 2099 would fire nowhere when written in 2026.
    """

    # croniter reads every field's bounds from cls.RANGES; its stubs mark the name final.
    RANGES = (*croniter.RANGES[:6], (1970, LAST_YEAR))  # type: ignore[misc]
    #: Every year a year field can name is within this many years of any other.
    MAX_YEARS_BETWEEN_MATCHES = LAST_YEAR - 1970
_WEEKDAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


@dataclass(frozen=True)
class CronSchedule:
    """A parsed cron expression in a time zone."""

    expression: str
    timezone: str
    #: The expression in croniter's form: seconds first, weekday 0 = Sunday, 6 or 7 fields.
    fields: str

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_fire(self, after: datetime) -> Optional[datetime]:
        """The first instant strictly after ``after`` (aware) that the expression names, in UTC.

        Returns None when no instant follows: a year field whose last year has passed.
        """
        after = after.astimezone(UTC)
        zone = self.zone
        best: Optional[datetime] = None
        best_wall_time: Optional[datetime] = None
        for wall_time in self._wall_times_after(after.astimezone(zone).replace(tzinfo=None)):
            # Real times map to themselves and times in a gap to later ones, so once
            # the wall time passes the best instant's, nothing later can beat it.
            if best_wall_time is not None and wall_time >= best_wall_time:
                return best
            instant = _instant(wall_time, zone)
            if instant > after and (best is None or instant < best):
                best, best_wall_time = instant, instant.astimezone(zone).replace(tzinfo=None)
        return best

    def _wall_times_after(self, start: datetime) -> Iterator[datetime]:
        iterator = _Croniter(self.fields, start, second_at_beginning=True,
                             max_years_between_matches=_Croniter.MAX_YEARS_BETWEEN_MATCHES)
        for _ in range(_MAX_CANDIDATES):
            try:
                yield iterator.get_next(datetime)
            except Exception:  # noqa: BLE001 - croniter's CroniterBadDateError: nothing matches any more
                return


def parse_cron(expression: Any, timezone_name: Any = DEFAULT_TIMEZONE) -> CronSchedule:
    """Parse ``expression`` in ``timezone_name``.

    Raises:
        InvalidCron: the expression is malformed; the message names the field.
        InvalidTimezone: the zone is not an IANA name known here.
    """
    check_timezone(timezone_name)
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidCron(f"a cron expression must be non-blank text, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise InvalidCron(f"a cron expression may have at most {MAX_EXPRESSION_LENGTH} characters")
    return _parse(expression, timezone_name)


# A scheduler tick parses every due schedule's expression; checking each field
# with croniter costs about a millisecond, and schedules share few expressions.
@functools.lru_cache(maxsize=1_024)
def _parse(expression: str, timezone_name: str) -> CronSchedule:
    text = " ".join(expression.split())
    if text.startswith("@"):
        fields = _NICKNAMES.get(text.lower())
        if fields is None:
            raise InvalidCron(f"unknown cron nickname {text!r}: use one of {', '.join(sorted(_NICKNAMES))}")
        return CronSchedule(expression, timezone_name, fields)
    parts = text.split(" ")
    if len(parts) not in (5, 6, 7):
        raise InvalidCron(
            f"cron expression {expression!r} has {len(parts)} fields; expected 5 (min hour day month weekday), "
            "or 6-7 seconds first (sec min hour day month weekday [year])"
        )
    seconds_first = len(parts) != 5
    if not seconds_first:
        parts = ["0", *parts]
    parts = [_single_values(expression, index, part) for index, part in enumerate(parts)]
    parts[_DAY_OF_WEEK] = _weekdays(expression, parts[_DAY_OF_WEEK], seconds_first)
    if any(mark in parts[_DAY_OF_WEEK] for mark in "#L") and parts[_DAY_OF_MONTH] not in ("*", "?"):
        raise InvalidCron(
            f"cron expression {expression!r}: a day of week with # or L needs day of month * or ?, "
            f"got {parts[_DAY_OF_MONTH]!r}"
        )
    for index, part in enumerate(parts):
        _check_field(expression, parts, index, part)
    return CronSchedule(expression, timezone_name, " ".join(parts))


def names_no_time_after(name: str, expression: str, after: datetime) -> InvalidCron:
    """The error for a write (or resume) that would leave a schedule with no instant to fire at."""
    return InvalidCron(f"schedule {name!r}: cron expression {expression!r} names no time after "
                       f"{after.astimezone(UTC).isoformat()}, so it would never fire")


def check_timezone(name: Any) -> str:
    """Return ``name`` if it is an IANA zone name known here.

    ``localtime`` is refused: it is whichever zone each machine is set to, so
    workers on two machines would fire one schedule at two instants.

    Raises:
        InvalidTimezone: it is not.
    """
    if not isinstance(name, str) or not name.strip() or len(name) > 64:
        raise InvalidTimezone(f"a time zone must be an IANA name such as 'Europe/Berlin', got {type(name).__name__}")
    if name not in _iana_zone_names():
        raise InvalidTimezone(f"unknown time zone {name!r}: use an IANA name such as 'Europe/Berlin'")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise InvalidTimezone(f"unknown time zone {name!r}: use an IANA name such as 'Europe/Berlin'") from error
    return name


@functools.lru_cache(maxsize=1)
def _iana_zone_names() -> frozenset[str]:
    # The system's zone directory also holds ``localtime``, a link to the machine's own zone.
    return frozenset(available_timezones() - {"localtime"})


def jitter_seconds(schedule_id: UUID, instant: datetime, max_jitter_seconds: int) -> int:
    """The spec's deterministic jitter: (id XOR instant in epoch ms) mod (max + 1) seconds."""
    if max_jitter_seconds <= 0:
        return 0
    millis = int(instant.timestamp() * 1000)
    return (schedule_id.int ^ millis) % (max_jitter_seconds + 1)


def next_fire_at(
    schedule: CronSchedule, schedule_id: UUID, max_jitter_seconds: int, after: datetime,
) -> Optional[datetime]:
    """When a schedule fires next: its first instant after ``after``, plus its jitter; None if none follows."""
    instant = schedule.next_fire(after)
    if instant is None:
        return None
    return instant + timedelta(seconds=jitter_seconds(schedule_id, instant, max_jitter_seconds))


def _instant(wall_time: datetime, zone: ZoneInfo) -> datetime:
    # fold=0 is the first of a repeated wall time, and for a time in a gap it reads
    # the wall time with the offset from before the gap: as far after the gap as it
    # was into it. Compared in UTC only: aware datetimes of one zone compare by wall time.
    return wall_time.replace(tzinfo=zone, fold=0).astimezone(UTC)


def _single_values(expression: str, index: int, field: str) -> str:
    """``field`` with each range whose ends are equal written as its one value; R, H and oversized steps refused."""
    if _RANDOM_OR_HASHED.match(field):
        raise InvalidCron(
            f"cron expression {expression!r}: the {_FIELD_NAMES[index]} field {field!r} asks for a random or "
            "hashed value (R or H), which names another time at each write: write the value itself"
        )
    terms = []
    for term in field.split(","):
        _check_step(expression, index, field, term)
        match = _EQUAL_RANGE.match(term)
        if match is not None and _same_value(match.group("low"), match.group("high")):
            term = match.group("low")
        terms.append(term)
    return ",".join(terms)


def _check_step(expression: str, index: int, field: str, term: str) -> None:
    # A step other than digits is left for croniter to refuse.
    match = _STEP.search(term)
    if match is None:
        return
    step, span = int(match.group("step")), _FIELD_SPANS[index]
    if not 1 <= step <= span:
        bound = "at least 1" if step < 1 else f"at most {span}"
        raise InvalidCron(
            f"cron expression {expression!r}: the {_FIELD_NAMES[index]} field {field!r}: a step is {bound}, "
            f"as the field has {span} values"
        )


def _same_value(low: str, high: str) -> bool:
    if low.isdigit() and high.isdigit():
        return int(low) == int(high)
    return low.lower() == high.lower()


def _weekdays(expression: str, field: str, seconds_first: bool) -> str:
    """The weekday field in croniter's terms: Runledger's numbers shifted, ``5L`` written ``L5``."""
    terms = []
    for term in field.split(","):
        body, slash, step = term.partition("/")
        match = _WEEKDAY_TERM.match(body)
        if body in ("*", "?") or match is None:
            terms.append(term)  # left for croniter to accept or refuse
            continue
        lead, first, last, rest = match.group("lead", "first", "last", "rest")
        is_last_weekday = bool(lead) or rest.upper() == "L"
        if is_last_weekday and (last or rest.startswith("#") or slash):
            raise InvalidCron(f"cron expression {expression!r}: the day of week term {term!r} is not valid: "
                              "the last weekday of the month is one day, such as 5L")
        if seconds_first:
            first, last = _shift_weekday(first), last and _shift_weekday(last)
        if is_last_weekday:
            # croniter takes the last weekday as L and a number only.
            terms.append(f"L{_WEEKDAY_NAMES.index(first.upper()) if first.isalpha() else first}")
            continue
        terms.append(first + (f"-{last}" if last else "") + rest + slash + step)
    return ",".join(terms)


def _shift_weekday(value: str) -> str:
    """Runledger's weekday number (1-7, Sunday = 1) in croniter's numbering (0-6, Sunday = 0)."""
    if not value.isdigit():
        return value
    number = int(value)
    if not 1 <= number <= 7:
        raise InvalidCron(
            f"day of week {number} is out of range: in the seconds-first form weekdays are 1-7 (Sunday = 1) "
            "or SUN-SAT"
        )
    return str(number - 1)


def _check_field(expression: str, parts: list[str], index: int, part: str) -> None:
    # croniter says only that the whole expression is bad: try the field alone among
    # stars to name the one that is wrong.
    probe = ["*"] * len(parts)
    probe[index] = part
    if not _Croniter.is_valid(" ".join(probe), second_at_beginning=True):
        raise InvalidCron(f"cron expression {expression!r}: the {_FIELD_NAMES[index]} field {part!r} is not valid")
    if index == len(parts) - 1 and not _Croniter.is_valid(" ".join(parts), second_at_beginning=True):
        raise InvalidCron(f"cron expression {expression!r} is not valid as a whole")
