"""The workflow family of the exception tree: bad definitions, missing runs and steps, conflicting retries.

The tree is drawn in :mod:`runledger_sync.core.errors`; import these classes
from here (or from ``runledger_sync``). Each family
derives from the base of its kind in that module, so a caller catching
``JobStateError`` or ``ConflictError`` catches the workflow cases too.
"""

from __future__ import annotations

from runledger_sync.core.errors import ConflictError, JobStateError, ValidationError
from runledger_sync.core.store_errors import StoreError


class InvalidWorkflow(ValidationError):
    """The workflow definition is invalid."""

    code = "workflow.invalid_definition"


class WorkflowEmpty(InvalidWorkflow):
    """A workflow needs at least one step."""

    code = "workflow.empty"


class WorkflowTooManySteps(InvalidWorkflow):
    """The workflow has more steps than one run may hold."""

    code = "workflow.too_many_steps"


class WorkflowTooLarge(InvalidWorkflow):
    """The workflow's step payloads together are larger than one run may hold."""

    code = "workflow.too_large"


class DuplicateStepKey(InvalidWorkflow):
    """Two steps of the workflow have the same key."""

    code = "workflow.duplicate_step_key"


class UnknownDependency(InvalidWorkflow):
    """A step depends on a step that is not part of this workflow."""

    code = "workflow.unknown_dependency"


class DependencyCycle(InvalidWorkflow):
    """The steps' dependencies form a cycle, so some step could never start."""

    code = "workflow.dependency_cycle"


class ExternalStepInvalidTerminalStatus(ValidationError):
    """An external step can only be completed as succeeded (True) or failed (False)."""

    code = "workflow.external_step_invalid_terminal_status"


class ExternalStepOutputInvalidStatus(ValidationError):
    """Only a succeeded external step can carry an output."""

    code = "workflow.external_step_output_invalid_status"


class WorkflowReleaseConflict(JobStateError):
    """A workflow dependent release conflicted with a cancellation."""

    code = "workflow.release_conflict"
    category = "conflict"


class WorkflowDefinitionNotFoundOrDisabled(JobStateError):
    """A job type of the workflow has no enabled definition."""

    code = "workflow.definition_not_found_or_disabled"


class WorkflowRunNotFound(JobStateError):
    """No workflow run with this id exists."""

    code = "workflow.run_not_found"


class WorkflowStepNotFound(JobStateError):
    """The workflow run has no step with this key."""

    code = "workflow.step_not_found"


class WorkflowRunFinished(JobStateError):
    """The workflow run has already finished and cannot be cancelled."""

    code = "workflow.run_finished"


class ExternalStepNotFound(JobStateError):
    """The workflow run has no step with this key."""

    code = "workflow.external_step_not_found"


class ExternalStepNotExternal(JobStateError):
    """The step is a job step; its job completes it."""

    code = "workflow.external_step_not_external"


class ExternalStepNotWaiting(JobStateError):
    """The external step is not waiting for an answer (still blocked, or cancelled)."""

    code = "workflow.external_step_not_waiting"


class WorkflowAlreadyEnqueued(ConflictError):
    """A workflow run with this idempotency key already exists."""

    code = "workflow.already_enqueued"


class WorkflowEnqueueConflictingRetry(ConflictError):
    """A workflow run with this idempotency key exists with a different request."""

    code = "workflow.enqueue_conflicting_retry"


class WorkflowLegacySnapshotMissing(ConflictError):
    """The existing workflow run with this idempotency key has no request snapshot to compare."""

    code = "workflow.legacy_idempotency_snapshot_missing"


class ExternalStepConflictingCompletion(ConflictError):
    """The external step was already completed with the other answer."""

    code = "workflow.external_step_conflicting_completion_retry"


class ExternalStepConflictingOutput(ConflictError):
    """The external step was already completed with a different output."""

    code = "workflow.external_step_conflicting_output_retry"


class WorkflowLinkageSymmetryViolation(StoreError):
    """A job and a workflow step do not point at each other (job_queue.workflow_step_id, workflow_steps.job_id)."""

    code = "workflow.linkage_symmetry_violation"
    category = "validation"


class WorkflowLinkageTriggerTableInvalid(StoreError):
    """The job/step linkage trigger fired on a table it does not know."""

    code = "workflow.linkage_symmetry_trigger_table_invalid"


class WorkflowAppendMutationKeyBlank(ValidationError):
    """An append needs a mutation key that is not blank: it names the append, so a retry changes nothing."""

    code = "workflow.append_mutation_key_blank"


class WorkflowAppendTerminalRun(JobStateError):
    """The workflow run has ended (or was cancelled): nothing can be appended to it."""

    code = "workflow.append_terminal_run"


class WorkflowAppendWindowMissing(JobStateError):
    """The run has no step with the append's window key."""

    code = "workflow.append_window_missing"


class WorkflowAppendWindowNotExternal(JobStateError):
    """The append's window is a job step; a window must be an external step."""

    code = "workflow.append_window_not_external"


class WorkflowAppendWindowNotOpen(JobStateError):
    """The append's window has already been answered (or cancelled): its dependents no longer wait for it."""

    code = "workflow.append_window_not_open"


class WorkflowAppendConflictingRetry(ConflictError):
    """The run already has an append with this mutation key, with different steps."""

    code = "workflow.append_conflicting_retry"
