"""The overview's chart layout (runledger_sync.web.charts): pure arithmetic, checked without a browser."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from runledger_sync.web import charts
from runledger_sync.web.charts import Series, line_chart, minutes_of, nice_step, stacked_bars

LAST = datetime(2026, 12, 5, 14, 59, tzinfo=timezone.utc)


@pytest.mark.parametrize(("maximum", "step"), [
    (0, 1.0), (1, 0.5), (4, 1.0), (7, 2.0), (10, 5.0), (19, 5.0), (20, 5.0), (21, 10.0), (950, 500.0), (0.3, 0.1),
])
def test_the_y_step_is_one_two_or_five_times_a_power_of_ten_reaching_the_maximum_in_four(maximum, step):
    assert nice_step(maximum) == pytest.approx(step)
    assert nice_step(maximum) * charts.Y_TICKS >= maximum


def test_minutes_of_counts_back_from_the_last_minute_oldest_first():
    minutes = minutes_of(LAST, 3)
    assert [m.strftime("%H:%M") for m in minutes] == ["14:57", "14:58", "14:59"]


def test_stacked_bars_stack_the_series_of_each_sampled_minute_and_skip_the_others():
    minutes = minutes_of(LAST, 60)
    ok = [None] * 60
    failed = [None] * 60
    ok[10], failed[10] = 6, 2
    ok[59], failed[59] = 0, 0
    chart = stacked_bars("Throughput", minutes, [Series("succeeded", "ok", ok), Series("failed", "bad", failed)],
                         unit="attempts")

    assert [(bar.css_class, bar.height) for bar in chart.bars] == [
        ("ok", pytest.approx(6 / 8 * (chart.bottom - chart.top))),
        ("bad", pytest.approx(2 / 8 * (chart.bottom - chart.top))),
    ]
    low, high = chart.bars
    assert low.y + low.height == pytest.approx(chart.bottom)  # on the axis
    assert high.y + high.height == pytest.approx(low.y)  # on top of the first
    assert low.x > chart.left and low.x + low.width < chart.left + (chart.right - chart.left) * 11 / 60
    assert high.title == low.title == "14:10 UTC: 6 succeeded, 2 failed"
    assert chart.legend == [("succeeded", "ok"), ("failed", "bad")]
    assert chart.description == "Per minute over the last 60 minutes: 6 succeeded, 2 failed attempts."
    assert not chart.empty


def test_the_y_axis_runs_from_zero_to_a_whole_number_of_steps_at_or_above_the_tallest_bar():
    minutes = minutes_of(LAST, 2)
    chart = stacked_bars("t", minutes, [Series("a", "a", [7, 3])], unit="jobs")
    assert [tick.label for tick in chart.y_ticks] == ["0", "2", "4", "6", "8"]
    assert chart.y_ticks[0].position == chart.bottom and chart.y_ticks[-1].position == chart.top
    big = stacked_bars("t", minutes, [Series("a", "a", [42_000, 1])], unit="jobs")
    assert [tick.label for tick in big.y_ticks] == ["0", "20k", "40k", "60k"]
    one = stacked_bars("t", minutes, [Series("a", "a", [1, 0])], unit="jobs")
    assert [tick.label for tick in one.y_ticks] == ["0", "1"]  # counts: no half steps
    wait = line_chart("t", minutes, [Series("a", "a", [0.3, 0.1])], unit="s")
    assert [tick.label for tick in wait.y_ticks] == ["0", "0.1", "0.2", "0.3"]


def test_x_labels_fall_on_round_minutes_at_most_seven_of_them():
    hour = stacked_bars("t", minutes_of(LAST, 60), [Series("a", "a", [1] * 60)], unit="jobs")
    assert [tick.label for tick in hour.x_ticks] == ["14:00", "14:10", "14:20", "14:30", "14:40", "14:50"]
    day = stacked_bars("t", minutes_of(LAST, 1440), [Series("a", "a", [1] * 1440)], unit="jobs")
    assert len(day.x_ticks) <= charts.X_LABELS and all(t.label.endswith(":00") for t in day.x_ticks)
    assert all(hour.left < tick.position < hour.right for tick in hour.x_ticks)


def test_a_window_with_no_sample_is_empty_and_still_has_axes():
    chart = line_chart("Due", minutes_of(LAST, 60), [Series("ready", "ready", [None] * 60)], unit="jobs", whole=True)
    assert chart.empty and chart.lines == [] and chart.bars == []
    assert [tick.label for tick in chart.y_ticks] == ["0", "1"]
    assert chart.x_ticks


def test_a_line_breaks_where_a_minute_was_not_sampled_and_a_lone_sample_is_a_dot():
    values = [1.0, 2.0, None, 4.0, None]
    chart = line_chart("Wait", minutes_of(LAST, 5), [Series("oldest", "wait", values)], unit="s")
    first, lone = chart.lines
    assert len(first.points.split()) == 2
    assert lone.points.split()[0] == lone.points.split()[1]
    top_y = float(lone.points.split()[0].split(",")[1])
    assert top_y == pytest.approx(chart.top)  # 4 is the axis' top: 4 steps of 1
    assert chart.description == "Over the last 5 minutes; latest: oldest 4 s."
