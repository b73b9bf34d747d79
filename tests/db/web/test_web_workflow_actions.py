"""A workflow run's page: its graph drawn as SVG, and its actions (answer an external step, cancel the run) and their refusals."""

from __future__ import annotations

import re
from typing import Any

import pytest
from werkzeug.test import Client

import runledger_sync as rl
from runledger_sync.web import allow_anyone, create_app
from tests.db.web.conftest import Browser, CSRF_FIELD, EMAIL, HOSTILE, REPORT, allow_all, page, post_form


def order(organization_id: Any = None, key: str = "order-42") -> rl.WorkflowRunRecord:
    wf = rl.Workflow("order.fulfil", idempotency_key=key, organization_id=organization_id)
    approve = wf.external("approve")
    charge = wf.job("charge", EMAIL, {"order": 42}, after=[approve], release="on_success")
    wf.job("notify", REPORT, {"order": 42}, after=[charge])
    return wf


@pytest.fixture
def run(db) -> rl.WorkflowRunRecord:
    return rl.enqueue_workflow(db, order())


def run_page(run: rl.WorkflowRunRecord) -> str:
    return f"/workflows?run={run.id}"


def statuses(db: Any, run: rl.WorkflowRunRecord) -> dict[str, str]:
    found = rl.get_workflow_run(db, run.id)
    return {"run": found.status.value, **{step.key: step.status.value for step in found.steps}}


def answer(client: Client, run: rl.WorkflowRunRecord, outcome: str, **fields: str) -> Any:
    return post_form(client, run_page(run), "/workflows/complete_external_step",
                     {"run_id": str(run.id), "step_key": "approve", "outcome": outcome, **fields})


def test_the_graph_is_svg_in_columns_with_an_edge_per_dependency_and_a_legend(db, client, run):
    html = page(client, run_page(run))
    graph = html.split('id="step-graph"', 1)[1].split("</svg>", 1)[0]

    columns = [re.findall(r'data-step="([a-z]+)"', column) for column in graph.split('class="layer"')[1:]]
    assert columns == [["approve"], ["charge"], ["notify"]]
    edges = re.findall(r'<path class="(edge[^"]*)" d="M[\d,. C]+" marker-end="url\(#arrow\)" '
                       r'data-source="([a-z]+)" data-target="([a-z]+)"', graph)
    assert edges == [("edge on-success", "approve", "charge"), ("edge", "charge", "notify")]
    assert '<rect class="node status-waiting_for_external"' in graph and '<rect class="node status-blocked"' in graph
    legend = html.split('id="legend"', 1)[1].split("</ul>", 1)[0]
    assert [s.value for s in rl.WorkflowStepStatus] == re.findall(r"</svg> ([A-Z_]+)</li>", legend)
    # Drawn on the server: the page's only script is the shared live refresh, none draws the graph.
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/live.js" defer>']


def test_answering_an_external_step_releases_its_dependents_with_the_output(db, admin, run):
    response = answer(admin, run, "succeeded", output='{"approved_by": "ada"}')

    assert response.status_code == 303
    assert response.headers["Location"] == f"/workflows?run={run.id}&done=answered&step=approve"
    found = rl.get_workflow_run(db, run.id)
    assert (found.step("approve").status.value, found.step("approve").output) == ("SUCCEEDED", {"approved_by": "ada"})
    assert found.step("charge").status.value == "ENQUEUED"
    assert 'id="done">The step was answered. (approve)<' in page(admin, response.headers["Location"])


def test_answering_failed_fails_the_step_and_cancels_what_waits_on_its_success(db, admin, run):
    assert answer(admin, run, "failed").status_code == 303

    # notify waits for charge's end, whatever it is: a cancelled charge releases it.
    assert statuses(db, run) == {"run": "RUNNING", "approve": "FAILED", "charge": "CANCELED", "notify": "ENQUEUED"}
    assert rl.get_workflow_run(db, run.id).step("approve").error_code == "workflow.external_step_failed"


@pytest.mark.parametrize(("fields", "status", "code"), [
    ({"outcome": "maybe"}, 400, "job.invalid_argument"),
    ({"outcome": "succeeded", "output": "{not json"}, 400, "job.invalid_argument"),
    ({"outcome": "succeeded", "output": "[" * 100_000}, 400, "job.invalid_argument"),
    ({"outcome": "succeeded", "step_key": "charge"}, 409, "workflow.external_step_not_external"),
    ({"outcome": "succeeded", "step_key": "nope"}, 404, "workflow.external_step_not_found"),
    ({"outcome": "succeeded", "run_id": "not-a-uuid"}, 400, "job.invalid_argument"),
])
def test_a_bad_answer_is_refused_with_its_code_and_changes_nothing(db, admin, run, fields, status, code):
    outcome = fields.pop("outcome")
    response = answer(admin, run, outcome, **fields)

    assert response.status_code == status, response.get_data(as_text=True)
    assert f'id="error-code">{code}<' in response.get_data(as_text=True)
    assert statuses(db, run) == {"run": "WAITING_FOR_EXTERNAL", "approve": "WAITING_FOR_EXTERNAL", "charge": "BLOCKED",
                                 "notify": "BLOCKED"}


def test_a_step_answered_already_is_a_conflict_and_its_form_is_gone(db, admin, run):
    rl.complete_external_step(db, run.id, "approve", succeeded=False)
    assert "complete_external_step" not in page(admin, run_page(run))

    response = post_form(admin, run_page(run), "/workflows/complete_external_step",
                         {"run_id": str(run.id), "step_key": "approve", "outcome": "succeeded"})
    assert response.status_code == 409 and "workflow.external_step_conflicting_completion" in response.get_data(as_text=True)


def test_cancel_the_run_cancels_its_unstarted_steps_and_the_button_goes(db, admin, run):
    response = post_form(admin, run_page(run), "/workflows/cancel_workflow_run", {"run_id": str(run.id)})

    assert response.headers["Location"] == f"/workflows?run={run.id}&done=canceled"
    assert statuses(db, run) == {"run": "CANCELED", "approve": "CANCELED", "charge": "CANCELED", "notify": "CANCELED"}
    after = page(admin, response.headers["Location"])
    assert 'id="done">The run was canceled.<' in after and 'id="cancel-run"' not in after
    assert "CANCELED_FROM_DASHBOARD" in after


def test_cancel_of_a_finished_run_is_a_conflict(db, admin):
    wf = rl.Workflow("quick")
    wf.external("only")
    run = rl.enqueue_workflow(db, wf)
    rl.complete_external_step(db, run.id, "only")

    other = rl.enqueue_workflow(db, order())  # a run whose page draws a form
    response = post_form(admin, run_page(other), "/workflows/cancel_workflow_run", {"run_id": str(run.id)})
    assert response.status_code == 409 and 'id="error-code">workflow.run_finished<' in response.get_data(as_text=True)


# -- refusals -----------------------------------------------------------------------------------


def test_read_only_draws_no_action_and_refuses_the_posts(db, client, run):
    html = page(client, run_page(run))
    assert 'id="cancel-run"' not in html and "complete_external_step" not in html and "csrf_token" not in html
    for action, data in (("cancel_workflow_run", {}), ("complete_external_step", {"step_key": "approve", "outcome": "succeeded"})):
        response = client.post(f"/workflows/{action}", data={"run_id": str(run.id), "csrf_token": "0" * 64, **data})
        assert response.status_code == 403 and 'id="error-code">web.read_only<' in response.get_data(as_text=True)
    assert statuses(db, run)["approve"] == "WAITING_FOR_EXTERNAL"


def test_a_post_without_its_token_or_from_another_origin_is_refused(db, admin, run):
    token = CSRF_FIELD.search(page(admin, run_page(run))).group(1)
    data = {"run_id": str(run.id), "step_key": "approve", "outcome": "succeeded"}

    missing = admin.post("/workflows/complete_external_step", data=data)
    elsewhere = admin.post("/workflows/cancel_workflow_run", data={"run_id": str(run.id), "csrf_token": token},
                           headers={"Origin": "http://localhost:9999"})
    cross_site = admin.post("/workflows/complete_external_step", data={**data, "csrf_token": token},
                            headers={"Sec-Fetch-Site": "cross-site"})

    assert missing.status_code == 403 and "web.csrf_rejected" in missing.get_data(as_text=True)
    assert elsewhere.status_code == 403 and "web.cross_origin_rejected" in elsewhere.get_data(as_text=True)
    assert cross_site.status_code == 403 and "web.cross_origin_rejected" in cross_site.get_data(as_text=True)
    assert statuses(db, run)["approve"] == "WAITING_FOR_EXTERNAL"
    # The same token from this dashboard's own origin works.
    assert admin.post("/workflows/cancel_workflow_run", data={"run_id": str(run.id), "csrf_token": token},
                      headers={"Origin": "http://localhost"}).status_code == 303


def test_the_hook_is_asked_for_each_action_by_name(db, run):
    asked: list[str] = []

    def answers_only(request: Any, action: str) -> bool:
        asked.append(action)
        return action in ("view", "complete_external_step")

    operators = Browser(create_app(db, read_only=False, authorize=answers_only))
    html = page(operators, run_page(run))
    assert "complete_external_step" in html and 'id="cancel-run"' not in html
    response = post_form(operators, run_page(run), "/workflows/cancel_workflow_run", {"run_id": str(run.id)})
    assert response.status_code == 403 and "web.action_forbidden" in response.get_data(as_text=True)
    assert {"cancel_workflow_run", "complete_external_step"} <= set(asked)
    assert answer(operators, run, "succeeded").status_code == 303
    assert statuses(db, run)["approve"] == "SUCCEEDED"


def test_a_scoped_dashboard_cannot_act_on_another_organizations_run(db):
    theirs = rl.enqueue_workflow(db, order("org-b", key="b"))
    mine = rl.enqueue_workflow(db, order("org-a", key="a"))
    scoped = Browser(create_app(db, read_only=False, authorize=allow_all, organization_id="org-a"))

    for action, data in (("cancel_workflow_run", {}), ("complete_external_step", {"step_key": "approve", "outcome": "succeeded"})):
        response = post_form(scoped, run_page(mine), f"/workflows/{action}", {"run_id": str(theirs.id), **data})
        assert response.status_code == 404 and "workflow.run_not_found" in response.get_data(as_text=True)
    assert statuses(db, theirs)["approve"] == "WAITING_FOR_EXTERNAL"


def test_hostile_run_names_and_step_keys_are_escaped_in_the_graph_and_the_table(db):
    wf = rl.Workflow(HOSTILE)
    wait = wf.external(HOSTILE)
    wf.job("after" + HOSTILE, EMAIL, {}, after=[wait])
    run = rl.enqueue_workflow(db, wf)
    admin = Browser(create_app(db, read_only=False, authorize=allow_anyone))
    response = post_form(admin, run_page(run), "/workflows/complete_external_step",
                         {"run_id": str(run.id), "step_key": HOSTILE, "outcome": "succeeded",
                          "output": '{"note": "</text><script>alert(1)</script>"}'})
    assert response.status_code == 303

    html = page(admin, response.headers["Location"])
    assert "<script>alert" not in html and "<img src=x" not in html and "</text><script>" not in html
    graph = html.split('id="step-graph"', 1)[1].split("</svg>", 1)[0]
    assert 'data-step="&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"' in graph
    assert 'class="key">&lt;script&gt;alert(&#34;x&#34;)&lt;/s…</text>' in graph  # the label, cut to fit the box
