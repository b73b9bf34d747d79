"""Workflows: a run of job and external steps joined by dependencies (spec section 11).

:class:`Workflow` builds the definition in memory and checks it whole (unique
step keys, dependencies inside the workflow, no cycle) before anything is
written; :func:`runledger_sync.store.workflows.enqueue.enqueue_workflow` writes it.
:class:`WorkflowAppend` builds steps to add to a running run, checked against
the run's own steps by :func:`runledger_sync.store.workflows.append.append_workflow_steps`.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence
from uuid import UUID

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.meta import meta_json
from runledger_sync.core.workflow_errors import (
    DependencyCycle,
    DuplicateStepKey,
    UnknownDependency,
    WorkflowEmpty,
    WorkflowTooLarge,
    WorkflowTooManySteps,
)

STEP_KEY_MAX_LENGTH = 200
WORKFLOW_NAME_MAX_LENGTH = 200
#: How many keys of a dependency cycle its error names: a cycle may run through thousands.
CYCLE_KEYS_SHOWN = 20
#: The most steps one workflow may have. Each is a row, and its enqueue one transaction.
MAX_WORKFLOW_STEPS = 10_000
#: The most JSON bytes the payloads of one workflow's steps may come to together: each
#: is within the payload limit, but one enqueue holds them all in memory and one transaction.
MAX_WORKFLOW_PAYLOAD_BYTES = 64 * 1024 * 1024


class WorkflowRunStatus(str, enum.Enum):
    """Where a run is (column ``workflow_runs.status``), recomputed from its steps after each step change."""

    #: Some step is ENQUEUED or RUNNING.
    RUNNING = "RUNNING"
    #: Nothing can move until an external step is answered (BLOCKED steps behind it wait too).
    WAITING_FOR_EXTERNAL = "WAITING_FOR_EXTERNAL"
    #: Every step succeeded.
    SUCCEEDED = "SUCCEEDED"
    #: Every step ended, some failed or were cancelled.
    COMPLETED_WITH_ERRORS = "COMPLETED_WITH_ERRORS"
    #: Into: cancel_workflow_run; kept whatever its running steps do afterwards.
    CANCELED = "CANCELED"


class WorkflowStepStatus(str, enum.Enum):
    """Where a step is (column ``workflow_steps.status``)."""

    #: Into: enqueue. Out: its last prerequisite ends (released or cancelled), run cancel.
    BLOCKED = "BLOCKED"
    #: An external step released: waits for complete_external_step.
    WAITING_FOR_EXTERNAL = "WAITING_FOR_EXTERNAL"
    #: A job step released: its job is PENDING. Out: claim, run cancel.
    ENQUEUED = "ENQUEUED"
    #: Its job was claimed; a retry keeps it here. Out: the job's end, unstarted release.
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    @property
    def is_terminal(self) -> bool:
        return self in (WorkflowStepStatus.SUCCEEDED, WorkflowStepStatus.FAILED, WorkflowStepStatus.CANCELED)


class WorkflowStepKind(str, enum.Enum):
    """What a step is (column ``workflow_steps.kind``): a job it runs, or an answer it waits for."""

    JOB = "JOB"
    EXTERNAL = "EXTERNAL"


class WorkflowReleaseMode(str, enum.Enum):
    """When a dependency lets its dependent go (``workflow_step_dependencies.release_mode``)."""

    #: Once the prerequisite ended, whatever its outcome.
    ON_TERMINAL = "ON_TERMINAL"
    #: Only if the prerequisite succeeded; otherwise the dependent is cancelled.
    ON_SUCCESS = "ON_SUCCESS"


@dataclass(frozen=True)
class WorkflowStep:
    """One step of a :class:`Workflow`, as built; pass it in another step's ``after``."""

    key: str
    kind: WorkflowStepKind
    job_type: Optional[str]
    payload: Any
    after: tuple[str, ...]
    release: WorkflowReleaseMode
    priority: Optional[int] = None
    max_attempts: Optional[int] = None
    timeout_seconds: Optional[int] = None
    #: The step's job may continue (``JobCompletion(continue_after=...)``, ``Snooze``).
    continuation: bool = False
    #: The workflow that built the step: a step of another workflow is not a valid dependency.
    owner: Any = field(default=None, repr=False, compare=False)


class StepBuilder:
    """The steps a :class:`Workflow` or a :class:`WorkflowAppend` is built of, each checked as it is added."""

    def __init__(self, described: str) -> None:
        #: How errors name what is being built: ``workflow 'order.fulfil'``.
        self._described = described
        self._steps: list[WorkflowStep] = []
        self._keys: set[str] = set()

    @property
    def steps(self) -> tuple[WorkflowStep, ...]:
        return tuple(self._steps)

    def job(
        self, key: str, job_type: str, payload: Any = None, *, after: Iterable[WorkflowStep | str] = (),
        release: WorkflowReleaseMode | str = WorkflowReleaseMode.ON_TERMINAL, priority: Optional[int] = None,
        max_attempts: Optional[int] = None, timeout_seconds: Optional[int] = None, continuation: bool = False,
    ) -> WorkflowStep:
        """Add a step that runs a job of ``job_type`` once every step in ``after`` has ended.

        Args:
            after: the steps (or their keys) this one waits for.
            release: ``"on_terminal"`` (default) starts it whatever they ended with;
                ``"on_success"`` only if they all succeeded, and cancels it otherwise.
            priority: as for :func:`runledger_sync.enqueue`; unset, from the job type's definition.
            max_attempts: as for :func:`runledger_sync.enqueue`; unset, from the job type's definition.
            timeout_seconds: as for :func:`runledger_sync.enqueue`; unset, from the job type's definition.
            continuation: let the step's job continue (snooze); the step stays
                RUNNING meanwhile. Without it a continuation ends the job with
                ``job.workflow_handler_continuation_not_enabled``.

        Raises:
            InvalidArgument, InvalidJobType, InvalidPayload: nothing is added.
        """
        check.check_job_type(job_type)
        check.serialize_json("payload", {} if payload is None else payload)
        for name, value, allowed in (("priority", priority, check.PRIORITY_RANGE),
                                     ("max_attempts", max_attempts, check.MAX_ATTEMPTS_RANGE),
                                     ("timeout_seconds", timeout_seconds, check.TIMEOUT_SECONDS_RANGE)):
            check.check_optional_int(name, value, allowed)
        if not isinstance(continuation, bool):
            raise InvalidArgument("continuation", continuation, "True or False")
        return self._add(WorkflowStep(
            key, WorkflowStepKind.JOB, job_type, {} if payload is None else payload, self._keys_of(after),
            _release_mode(release), priority, max_attempts, timeout_seconds, continuation, owner=self,
        ))

    def external(
        self, key: str, *, after: Iterable[WorkflowStep | str] = (),
        release: WorkflowReleaseMode | str = WorkflowReleaseMode.ON_TERMINAL,
    ) -> WorkflowStep:
        """Add a step that something outside the queue completes (an approval, a webhook).

        Once released it waits in WAITING_FOR_EXTERNAL until
        :func:`runledger_sync.complete_external_step` answers it.
        """
        return self._add(WorkflowStep(
            key, WorkflowStepKind.EXTERNAL, None, None, self._keys_of(after), _release_mode(release), owner=self,
        ))

    def _add(self, step: WorkflowStep) -> WorkflowStep:
        check.check_text("key", step.key, max_length=STEP_KEY_MAX_LENGTH)
        if step.key in self._keys:
            raise DuplicateStepKey(f"{self._described} already has a step {step.key!r}", step_key=step.key)
        self._keys.add(step.key)
        self._steps.append(step)
        return step

    def _keys_of(self, after: Iterable[WorkflowStep | str]) -> tuple[str, ...]:
        if isinstance(after, (str, WorkflowStep)):
            after = [after]
        keys = []
        for prerequisite in after:
            if isinstance(prerequisite, WorkflowStep):
                if prerequisite.owner is not self:
                    raise UnknownDependency(
                        f"step {prerequisite.key!r} was built elsewhere", step_key=prerequisite.key)
                keys.append(prerequisite.key)
            elif isinstance(prerequisite, str):
                keys.append(prerequisite)
            else:
                raise InvalidArgument("after", type(prerequisite).__name__, "steps built here or their keys")
        return tuple(dict.fromkeys(keys))

    def check_payload_sizes(self, *, max_payload_bytes: int) -> None:
        """Check each job step's payload against ``max_payload_bytes`` and all of them against MAX_WORKFLOW_PAYLOAD_BYTES.

        Stops at the step that goes over, so a workflow far over the limit is not
        serialised whole first.

        Raises:
            InvalidPayload: a step's payload is not JSON or is larger than ``max_payload_bytes`` (the error names the step).
            WorkflowTooLarge: the payloads together are larger than MAX_WORKFLOW_PAYLOAD_BYTES (the error names the step
                that went over).
        """
        total = 0
        for step in self._steps:
            if step.kind is not WorkflowStepKind.JOB:
                continue
            text = check.serialize_json(f"the payload of step {step.key!r}", step.payload, max_bytes=max_payload_bytes)
            total += len(text.encode("utf-8"))
            if total > MAX_WORKFLOW_PAYLOAD_BYTES:
                raise WorkflowTooLarge(
                    f"{self._described}: its step payloads come to more than {MAX_WORKFLOW_PAYLOAD_BYTES} bytes "
                    f"of JSON together, over the limit at step {step.key!r}; keep large data elsewhere (a table, "
                    "a file) and pass a reference",
                    step_key=step.key, max_bytes=MAX_WORKFLOW_PAYLOAD_BYTES,
                )


class Workflow(StepBuilder):
    """A workflow definition to enqueue with :func:`runledger_sync.enqueue_workflow`.

    ``meta`` (text keys to text values, as :func:`runledger_sync.enqueue` takes) is
    stored with the run and given to the job of each step; it is not compared
    on an idempotent repeat.

    Example:
        >>> wf = Workflow("order.fulfil", idempotency_key="order-42")
        >>> charge = wf.job("charge", "payments.charge", {"order": 42})
        >>> ship = wf.job("ship", "shipping.send", {"order": 42}, after=[charge], release="on_success")
        >>> approve = wf.external("approval", after=[charge])
        >>> _ = wf.job("notify", "email.send", {"order": 42}, after=[ship, approve])
        >>> [step.key for step in wf.steps]
        ['charge', 'ship', 'approval', 'notify']
    """

    def __init__(self, name: str, *, idempotency_key: Optional[str] = None, organization_id: Optional[str] = None,
                 meta: Optional[Mapping[str, str]] = None):
        self.name = check.check_text("name", name, max_length=WORKFLOW_NAME_MAX_LENGTH)
        self.idempotency_key = check.check_optional_idempotency_key(idempotency_key)
        self.organization_id = check.check_optional_organization_id(organization_id)
        super().__init__(f"workflow {self.name!r}")
        meta_json(meta)  # checked here, so a bad one fails where it is given
        #: The metadata of every step's job (see :mod:`runledger_sync.core.meta`).
        self.meta: Optional[Mapping[str, str]] = None if meta is None else dict(meta)

    def validate(self) -> None:
        """Check the whole definition: some step and at most MAX_WORKFLOW_STEPS, known dependencies, no cycle.

        Raises:
            WorkflowEmpty, WorkflowTooManySteps, UnknownDependency, DependencyCycle: the definition is refused.
        """
        if not self._steps:
            raise WorkflowEmpty(f"workflow {self.name!r} has no steps")
        if len(self._steps) > MAX_WORKFLOW_STEPS:
            raise WorkflowTooManySteps(
                f"workflow {self.name!r} has {len(self._steps)} steps; a workflow may have at most "
                f"{MAX_WORKFLOW_STEPS}: split the work into several runs, or let one step enqueue the rest",
                steps=len(self._steps), max_steps=MAX_WORKFLOW_STEPS,
            )
        for step in self._steps:
            unknown = [key for key in step.after if key not in self._keys]
            if unknown:
                raise UnknownDependency(
                    f"step {step.key!r} depends on {unknown[0]!r}, which is not a step of workflow {self.name!r}",
                    step_key=step.key, dependency=unknown[0],
                )
        cycle = find_cycle({step.key: step.after for step in self._steps})
        if cycle:
            raise _cycle_error(self._described, cycle)


class WorkflowAppend(StepBuilder):
    """Steps to add to a running workflow run with :func:`runledger_sync.append_workflow_steps`.

    ``window`` names an EXTERNAL step of the run that has not been answered yet.
    The steps that wait for the window wait for every appended step too, so what
    comes after it (a fan-in, a report) runs once, after the appended work has
    ended. Answer the window (:func:`runledger_sync.complete_external_step`) once
    nothing more is to be appended. A new step's ``after`` names steps of the run
    (one that has already ended counts as done) or steps appended with it.

    Example:
        >>> more = WorkflowAppend(window="collect")
        >>> _ = more.job("page-1", "crawl.page", {"n": 1}, after=["list"])
        >>> _ = more.job("page-2", "crawl.page", {"n": 2}, after=["page-1"])
        >>> [step.key for step in more.steps]
        ['page-1', 'page-2']
    """

    def __init__(self, window: str) -> None:
        self.window = check.check_text("window", window, max_length=STEP_KEY_MAX_LENGTH)
        super().__init__(f"the steps appended at window {self.window!r}")

    def validate_against(self, run_steps: Mapping[str, Sequence[str]], window_dependents: Iterable[str]) -> None:
        """Check the steps as part of a run whose steps wait as ``run_steps`` says (each key: the keys it waits for).

        ``window_dependents`` are the run's steps that wait for the window; each is
        checked as waiting for every appended step too.

        Raises:
            WorkflowEmpty, WorkflowTooManySteps, DuplicateStepKey, UnknownDependency, DependencyCycle: refused.
        """
        if not self._steps:
            raise WorkflowEmpty(f"{self._described}: there are no steps to append")
        total = len(run_steps) + len(self._steps)
        if total > MAX_WORKFLOW_STEPS:
            raise WorkflowTooManySteps(
                f"{self._described}: the run would have {total} steps; a workflow may have at most "
                f"{MAX_WORKFLOW_STEPS}", steps=total, max_steps=MAX_WORKFLOW_STEPS,
            )
        taken = next((step.key for step in self._steps if step.key in run_steps), None)
        if taken is not None:
            raise DuplicateStepKey(f"the run already has a step {taken!r}", step_key=taken)
        for step in self._steps:
            unknown = [key for key in step.after if key not in self._keys and key not in run_steps]
            if unknown:
                raise UnknownDependency(
                    f"step {step.key!r} depends on {unknown[0]!r}, which is neither a step of the run nor appended "
                    "with it", step_key=step.key, dependency=unknown[0],
                )
        graph: dict[str, Sequence[str]] = {key: tuple(after) for key, after in run_steps.items()}
        graph.update((step.key, step.after) for step in self._steps)
        appended = tuple(step.key for step in self._steps)  # in build order, so a cycle is named the same each time
        for key in window_dependents:
            graph[key] = (*graph[key], *appended)
        cycle = find_cycle(graph)
        if cycle:
            raise _cycle_error(self._described, cycle)


def _cycle_error(described: str, cycle: list[str]) -> DependencyCycle:
    """The error naming ``cycle`` (first key repeated at the end), at most CYCLE_KEYS_SHOWN keys of it."""
    length = len(cycle) - 1
    if length <= CYCLE_KEYS_SHOWN:
        return DependencyCycle(f"{described} has a dependency cycle: {' -> '.join(cycle)}",
                               cycle=cycle, cycle_length=length)
    shown = cycle[:CYCLE_KEYS_SHOWN]
    return DependencyCycle(
        f"{described} has a dependency cycle of {length} steps: {' -> '.join(shown)} -> ... "
        f"and {length - CYCLE_KEYS_SHOWN} more, back to {cycle[0]!r}",
        cycle=shown, cycle_length=length,
    )


def _release_mode(value: WorkflowReleaseMode | str) -> WorkflowReleaseMode:
    if isinstance(value, str):
        try:
            return WorkflowReleaseMode(value.upper())
        except ValueError:
            pass
    raise InvalidArgument("release", value, "'on_terminal' or 'on_success'")


def find_cycle(after: dict[str, Sequence[str]]) -> list[str]:
    """A dependency cycle as keys (first key repeated at the end), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in after:
        if state.get(start):
            continue
        path = [start]
        stack = [iter(after[start])]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(after[nxt]))
    return []


class AppendSteps(Protocol):
    """How ``ctx.workflow`` appends to its run: on ``bind`` when given, else on the worker's own database."""

    def __call__(self, run_id: UUID, more: WorkflowAppend, *, mutation_key: str, bind: Any,
                 max_payload_bytes: int) -> "WorkflowRunRecord": ...


class WorkflowContext:
    """What a workflow step's handler sees as ``ctx.workflow``.

    The run and step are read on first use, and each prerequisite's output when
    asked for, so a handler that never looks pays no query.
    """

    def __init__(self, step_id: UUID, load_step: Callable[[UUID], tuple[UUID, str]],
                 load_output: Callable[[UUID, str], Any], append_steps: Optional[AppendSteps] = None) -> None:
        self.step_id = step_id
        self._load_step = load_step
        self._load_output = load_output
        self._append_steps = append_steps
        self._step: Optional[tuple[UUID, str]] = None
        self._lock = threading.Lock()

    def _loaded(self) -> tuple[UUID, str]:
        with self._lock:
            if self._step is None:
                self._step = self._load_step(self.step_id)
            return self._step

    @property
    def run_id(self) -> UUID:
        return self._loaded()[0]

    @property
    def step_key(self) -> str:
        return self._loaded()[1]

    def output_of(self, step_key: str) -> Any:
        """The stored output of step ``step_key`` of this run: its job's output, or an external step's.

        None while that step has not finished, or when it stored none.

        Raises:
            WorkflowStepNotFound: the run has no such step.
        """
        return self._load_output(self.run_id, step_key)

    def append(self, more: WorkflowAppend, *, mutation_key: str, bind: Any = None,
               max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES) -> "WorkflowRunRecord":
        """Add steps to this step's run, as :func:`runledger_sync.append_workflow_steps` does.

        Args:
            bind: the Connection, ORM Session or psycopg connection of the transaction
                you complete the job in (``ctx.complete_in(bind)``): the append joins it,
                so the new steps and the job's success commit together. Without one the
                append commits on its own, on the worker's database.
            mutation_key: names this append in the run; a retried attempt that
                appends the same steps under it changes nothing.

        Raises:
            RuntimeError: called outside a worker; otherwise what
                :func:`runledger_sync.append_workflow_steps` raises.
        """
        if self._append_steps is None:
            raise RuntimeError("ctx.workflow.append is only available inside a worker")
        return self._append_steps(self.run_id, more, mutation_key=mutation_key, bind=bind,
                                  max_payload_bytes=max_payload_bytes)


@dataclass(frozen=True)
class WorkflowStepRecord:
    """One row of ``workflow_steps``, with the keys of the steps it waits for."""

    id: UUID
    key: str
    kind: WorkflowStepKind
    status: WorkflowStepStatus
    job_type: Optional[str]
    job_id: Optional[UUID]
    deps: tuple[str, ...]
    release: WorkflowReleaseMode
    dependencies_total: int
    dependencies_pending: int
    dependencies_unsatisfied: int
    #: The job's output (job steps) or the answer's (external steps), once finished.
    output: Any
    error_code: Optional[str]
    error_message: Optional[str]
    created_at: datetime
    finished_at: Optional[datetime]


@dataclass(frozen=True)
class WorkflowMutationRecord:
    """One append applied to a run (a row of ``workflow_run_mutations``)."""

    mutation_key: str
    #: The external step the steps were appended at.
    window: str
    #: The keys of the steps it added, in the order they were built.
    step_keys: tuple[str, ...]
    created_at: datetime


@dataclass(frozen=True)
class WorkflowRunRecord:
    """One row of ``workflow_runs`` and, when read with :func:`get_workflow_run`, its steps in creation order."""

    id: UUID
    name: str
    status: WorkflowRunStatus
    organization_id: Optional[str]
    idempotency_key: Optional[str]
    status_reason: Optional[str]
    created_at: datetime
    updated_at: datetime
    finished_at: Optional[datetime]
    steps: tuple[WorkflowStepRecord, ...] = ()
    #: The metadata every step's job is enqueued with.
    meta: Mapping[str, str] = field(default_factory=dict)
    #: The appends applied to the run, oldest first (read with its steps).
    mutations: tuple[WorkflowMutationRecord, ...] = ()

    def step(self, key: str) -> WorkflowStepRecord:
        """The step with this key (KeyError if there is none)."""
        for step in self.steps:
            if step.key == key:
                return step
        raise KeyError(key)
