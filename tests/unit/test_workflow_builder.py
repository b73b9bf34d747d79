"""The workflow builder: each step checked as it is added, the whole definition before it is written."""

from __future__ import annotations

import pytest

import runledger_sync as rl
from runledger_sync.core.workflow import MAX_WORKFLOW_STEPS, find_cycle


def test_steps_keep_their_order_dependencies_and_release_mode():
    wf = rl.Workflow("order.fulfil", idempotency_key="order-42", organization_id="org-1")
    charge = wf.job("charge", "payments.charge", {"order": 42}, priority=5, max_attempts=3, timeout_seconds=60)
    ship = wf.job("ship", "shipping.send", after=charge, release="on_success")
    gate = wf.external("approval", after=["charge"])
    wf.job("notify", "email.send", after=[ship, gate, ship])

    wf.validate()

    assert [(s.key, s.kind.value, s.after, s.release.value) for s in wf.steps] == [
        ("charge", "JOB", (), "ON_TERMINAL"),
        ("ship", "JOB", ("charge",), "ON_SUCCESS"),
        ("approval", "EXTERNAL", ("charge",), "ON_TERMINAL"),
        ("notify", "JOB", ("ship", "approval"), "ON_TERMINAL"),
    ]
    assert (charge.priority, charge.max_attempts, charge.timeout_seconds, charge.payload) == (5, 3, 60, {"order": 42})
    assert wf.steps[1].payload == {}


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda wf: wf.job(" ", "a.b"), rl.InvalidArgument),
        (lambda wf: wf.job("a", ""), rl.errors.InvalidJobType),
        (lambda wf: wf.job("a", "a.b", float("nan")), rl.InvalidPayload),
        (lambda wf: wf.job("a", "a.b", priority=10**9), rl.InvalidArgument),
        (lambda wf: wf.job("a", "a.b", release=None), rl.InvalidArgument),
        (lambda wf: wf.job("a", "a.b", after=[3]), rl.InvalidArgument),
        (lambda wf: (wf.job("a", "a.b"), wf.external("a")), rl.errors.DuplicateStepKey),
    ],
)
def test_a_bad_step_is_refused_as_it_is_added_and_not_kept(build, error):
    wf = rl.Workflow("bad")
    with pytest.raises(error):
        build(wf)
    assert len(wf.steps) <= 1


def test_a_blank_name_or_key_is_refused():
    with pytest.raises(rl.InvalidArgument):
        rl.Workflow("")
    with pytest.raises(rl.InvalidArgument):
        rl.Workflow("w", idempotency_key=" ")


@pytest.mark.parametrize(
    ("graph", "cycle"),
    [
        ({"a": [], "b": ["a"], "c": ["a", "b"]}, []),
        ({"a": ["a"]}, ["a", "a"]),
        ({"a": ["c"], "b": ["a"], "c": ["b"], "d": []}, ["a", "c", "b", "a"]),
        ({"x": [], "a": ["b"], "b": ["c"], "c": ["b"]}, ["b", "c", "b"]),
    ],
)
def test_find_cycle(graph, cycle):
    assert find_cycle(graph) == cycle


def test_a_long_chain_has_no_cycle_and_no_recursion_limit():
    graph = {f"s{i}": [f"s{i - 1}"] if i else [] for i in range(5_000)}
    assert find_cycle(graph) == []


class _CountedKey(str):
    """A step key that counts how often it is compared or hashed."""

    calls = 0

    def __eq__(self, other):
        _CountedKey.calls += 1
        return str.__eq__(self, other)

    def __hash__(self):
        _CountedKey.calls += 1
        return str.__hash__(self)


def _key_operations_to_build(steps: int) -> int:
    _CountedKey.calls = 0
    wf = rl.Workflow("long")
    for index in range(steps):
        wf.job(_CountedKey(f"s{index}"), "a.b", after=[f"s{index - 1}"] if index else ())
    wf.validate()
    return _CountedKey.calls


def test_building_a_workflow_costs_a_bounded_number_of_key_operations_per_step():
    # A duplicate check that scans every earlier step costs n*n/2 comparisons.
    for steps in (1_000, 2_000):
        assert _key_operations_to_build(steps) <= 10 * steps


def test_a_cycle_over_thousands_of_steps_is_named_by_a_short_sample():
    wf = rl.Workflow("ring")
    for index in range(5_000):
        wf.job(f"step-{index}", "a.b", after=[f"step-{(index + 1) % 5_000}"])
    with pytest.raises(rl.errors.DependencyCycle) as raised:
        wf.validate()
    message = str(raised.value)
    assert len(message) < 2_000
    assert "step-0 -> step-1 -> step-2" in message and "and 4980 more" in message
    assert len(raised.value.details["cycle"]) == 20 and raised.value.details["cycle_length"] == 5_000


def test_a_short_cycle_is_named_whole():
    wf = rl.Workflow("ring")
    wf.job("a", "a.b", after=["c"])
    wf.job("b", "a.b", after=["a"])
    wf.job("c", "a.b", after=["b"])
    with pytest.raises(rl.errors.DependencyCycle) as raised:
        wf.validate()
    assert str(raised.value).endswith("has a dependency cycle: a -> c -> b -> a")


def test_the_workflow_limits_are_10000_steps_and_64_mib_of_step_payloads():
    from runledger_sync.core.workflow import MAX_WORKFLOW_PAYLOAD_BYTES, MAX_WORKFLOW_STEPS

    assert (MAX_WORKFLOW_STEPS, MAX_WORKFLOW_PAYLOAD_BYTES) == (10_000, 64 * 1024 * 1024)


def test_step_payloads_up_to_64_mib_together_pass_and_one_byte_more_is_refused():
    from runledger_sync.core.workflow import MAX_WORKFLOW_PAYLOAD_BYTES
    from runledger_sync.core.workflow_errors import WorkflowTooLarge

    # 64 payloads of exactly 1 MiB of JSON each (the quotes included), external steps counting nothing.
    wf = rl.Workflow("exactly")
    blob = "x" * (MAX_WORKFLOW_PAYLOAD_BYTES // 64 - 2)
    for number in range(64):
        wf.job(f"s{number}", "email.send", blob)
    wf.external("approval")
    wf.check_payload_sizes(max_payload_bytes=MAX_WORKFLOW_PAYLOAD_BYTES // 64)

    wf.job("one.more", "email.send", 1)
    with pytest.raises(WorkflowTooLarge):
        wf.check_payload_sizes(max_payload_bytes=MAX_WORKFLOW_PAYLOAD_BYTES // 64)


# -- appending to a run (WorkflowAppend) ---------------------------------------------

#: A run as validate_against reads it: list and the window collect, report after both.
RUN = {"list": (), "collect": (), "report": ("list", "collect")}


def test_an_append_builds_steps_after_run_steps_or_its_own_and_checks_them_against_the_run():
    more = rl.WorkflowAppend(window="collect")
    first = more.job("page-1", "crawl.page", {"n": 1}, after=["list"])
    more.job("page-2", "crawl.page", {"n": 2}, after=[first, "collect"])
    more.external("more-pages", after=["page-2"])

    more.validate_against(RUN, ["report"])

    assert [(s.key, s.after) for s in more.steps] == [
        ("page-1", ("list",)), ("page-2", ("page-1", "collect")), ("more-pages", ("page-2",))]


@pytest.mark.parametrize(
    ("build", "error", "words"),
    [
        (lambda more: None, rl.errors.WorkflowEmpty, "no steps to append"),
        (lambda more: more.job("report", "crawl.page"), rl.errors.DuplicateStepKey, "already has a step 'report'"),
        (lambda more: more.job("page", "crawl.page", after=["nope"]), rl.errors.UnknownDependency, "'nope'"),
        # report waits for the window, so for every appended step: one after report closes a cycle.
        (lambda more: more.job("page", "crawl.page", after=["report"]), rl.errors.DependencyCycle,
         "the steps appended at window 'collect' has a dependency cycle"),
        (lambda more: (more.job("a", "crawl.page", after=["b"]), more.job("b", "crawl.page", after=["a"])),
         rl.errors.DependencyCycle, "a -> b -> a"),
    ],
)
def test_an_append_that_does_not_fit_the_run_is_refused_with_the_dag_codes(build, error, words):
    more = rl.WorkflowAppend(window="collect")
    build(more)
    with pytest.raises(error, match=words):
        more.validate_against(RUN, ["report"])


def test_the_same_step_after_the_report_is_no_cycle_when_report_does_not_wait_for_the_window():
    more = rl.WorkflowAppend(window="collect")
    more.job("page", "crawl.page", after=["report"])
    more.validate_against(RUN, [])


def test_an_append_that_would_take_the_run_past_the_step_limit_is_refused():
    run = {f"s{i}": () for i in range(MAX_WORKFLOW_STEPS)}
    more = rl.WorkflowAppend(window="s0")
    more.job("one-more", "crawl.page")
    with pytest.raises(rl.errors.WorkflowTooManySteps):
        more.validate_against(run, [])


def test_an_append_needs_a_window_and_refuses_another_builders_step():
    with pytest.raises(rl.InvalidArgument):
        rl.WorkflowAppend(window=" ")
    other = rl.Workflow("other").job("x", "crawl.page")
    with pytest.raises(rl.errors.UnknownDependency, match="built elsewhere"):
        rl.WorkflowAppend(window="w").job("y", "crawl.page", after=[other])
