"""The one exception tree of runledger-sync.

Every error the library raises on purpose is a :class:`RunledgerError` with a
stable, machine-readable ``code`` in the seed's ``area.snake_reason`` form.
Branch on ``.code`` or on the class, never on the message text::

    RunledgerError                              runledger.error
    ├── ConfigError                             config.invalid
    │   ├── MissingExtra                        config.missing_extra
    │   └── InvalidEncryptionKey                encryption.invalid_key
    ├── RegistrationError                       registry.invalid_registration
    │   ├── DuplicateJobType                    registry.duplicate_job_type
    │   ├── AsyncHandler                        registry.async_handler
    │   ├── HandlerSignature                    registry.handler_signature
    │   ├── UndeclaredQueue                     registry.undeclared_queue
    │   ├── InvalidPayloadModel                 registry.invalid_payload_model
    │   └── InvalidExceptionRules               registry.invalid_exception_rules
    ├── ValidationError                         runledger.validation_failed
    │   ├── InvalidArgument                     job.invalid_argument
    │   ├── InvalidJobType                      job.invalid_job_type
    │   ├── InvalidPayload                      job.invalid_payload
    │   │   ├── OutputTooLarge                  job.output_too_large
    │   │   └── CheckpointTooLarge              job.checkpoint_too_large
    │   ├── InvalidMeta                         job.invalid_meta
    │   ├── InvalidCompletionProgress           job.invalid_completion_progress
    │   ├── InvalidProgress                     job.invalid_progress
    │   ├── InvalidLeaseDuration                job.invalid_lease_duration
    │   ├── InvalidRetryDelay                   job.invalid_retry_delay
    │   ├── InvalidCron                         schedule.invalid_cron
    │   ├── InvalidTimezone                     schedule.invalid_timezone
    │   ├── InvalidQueueName                    queue.invalid_name
    │   ├── InvalidQueueSetting                 queue.invalid_setting
    │   ├── InvalidConcurrencyKey               job.invalid_execution_resource_key
    │   ├── ReplayKeyBlank                      job.replay_key_blank
    │   ├── ReplayKeyTooLong                    job.replay_key_too_long
    │   ├── ReplayReasonBlank                   job.replay_reason_blank
    │   ├── InvalidJobFilter                    job.invalid_filter
    │   │   └── EmptyJobFilter                  job.empty_filter
    │   ├── InvalidJobUpdate                    job.invalid_update
    │   ├── InvalidCoordination                 job.invalid_coordination
    │   │   ├── InvalidUnique                   job.invalid_unique
    │   │   └── InvalidDebounce                 job.invalid_debounce
    │   ├── EnqueueIdempotencyUnsupportedIsolation
    │   │                                       job.enqueue_idempotency_unsupported_isolation
    │   ├── CompareAndRequeueUnsupportedIsolation
    │   │                                       job.compare_and_requeue_unsupported_isolation
    │   ├── InvalidWorkflow                     workflow.invalid_definition
    │   │   ├── WorkflowEmpty                   workflow.empty
    │   │   ├── WorkflowTooManySteps            workflow.too_many_steps
    │   │   ├── WorkflowTooLarge                workflow.too_large
    │   │   ├── DuplicateStepKey                workflow.duplicate_step_key
    │   │   ├── UnknownDependency               workflow.unknown_dependency
    │   │   └── DependencyCycle                 workflow.dependency_cycle
    │   ├── ExternalStepInvalidTerminalStatus   workflow.external_step_invalid_terminal_status
    │   ├── ExternalStepOutputInvalidStatus     workflow.external_step_output_invalid_status
    │   ├── WorkflowAppendMutationKeyBlank      workflow.append_mutation_key_blank
    │   ├── InvalidBatchCallback                batch.invalid_callback
    │   ├── IncompleteRequestBody               web.incomplete_body
    │   └── HostNotAllowed                      web.host_not_allowed
    ├── JobStateError                           runledger.job_state_rejected
    │   ├── LeaseOwnerMismatch                  job.lease_owner_mismatch
    │   ├── UnstartedClaimReleaseNotApplicable  job.unstarted_claim_release_not_applicable
    │   ├── InvalidStateTransition              job.invalid_state_transition
    │   ├── JobNotFound                         job.not_found
    │   ├── ScheduleNotFound                    schedule.not_found
    │   ├── ScheduleDeclaredInCode              schedule.declared_in_code
    │   ├── DefinitionNotFoundOrDisabled        job.definition_not_found_or_disabled
    │   ├── QueueNotFound                       queue.not_found
    │   ├── WorkflowRequeueNotSupported         job.workflow_requeue_not_supported
    │   ├── WorkflowDeleteNotSupported          job.workflow_delete_not_supported
    │   ├── WorkflowReleaseConflict             workflow.release_conflict
    │   ├── WorkflowDefinitionNotFoundOrDisabled
    │   │                                       workflow.definition_not_found_or_disabled
    │   ├── WorkflowRunNotFound                 workflow.run_not_found
    │   ├── WorkflowStepNotFound                workflow.step_not_found
    │   ├── WorkflowRunFinished                 workflow.run_finished
    │   ├── ExternalStepNotFound                workflow.external_step_not_found
    │   ├── ExternalStepNotExternal             workflow.external_step_not_external
    │   ├── ExternalStepNotWaiting              workflow.external_step_not_waiting
    │   ├── WorkflowAppendTerminalRun           workflow.append_terminal_run
    │   ├── WorkflowAppendWindowMissing         workflow.append_window_missing
    │   ├── WorkflowAppendWindowNotExternal     workflow.append_window_not_external
    │   ├── WorkflowAppendWindowNotOpen         workflow.append_window_not_open
    │   ├── BatchNotFound                       batch.not_found
    │   ├── BatchClosed                         batch.closed
    │   └── BatchFinished                       batch.finished
    ├── ConflictError                           runledger.conflict
    │   ├── AlreadyEnqueued                     job.already_enqueued
    │   ├── IdempotencyConflict                 job.idempotency_conflict
    │   ├── IdempotencyConflictMissingExisting  job.idempotency_conflict_missing_existing
    │   ├── LegacyIdempotencySnapshotMissing    job.legacy_idempotency_snapshot_missing
    │   ├── RequeueExpectationFailed            job.requeue_expectation_failed
    │   ├── ReplayIdempotencyConflict           job.replay_idempotency_conflict
    │   ├── ReplayIdempotencyConflictMissingExisting
    │   │                                       job.replay_idempotency_conflict_missing_existing
    │   ├── WorkflowAlreadyEnqueued             workflow.already_enqueued
    │   ├── WorkflowEnqueueConflictingRetry     workflow.enqueue_conflicting_retry
    │   ├── WorkflowLegacySnapshotMissing       workflow.legacy_idempotency_snapshot_missing
    │   ├── ExternalStepConflictingCompletion   workflow.external_step_conflicting_completion_retry
    │   ├── ExternalStepConflictingOutput       workflow.external_step_conflicting_output_retry
    │   └── WorkflowAppendConflictingRetry      workflow.append_conflicting_retry
    ├── JobWaitTimeout                          job.wait_timeout
    ├── EncryptionKeyMissing                    encryption.key_missing
    ├── DecryptionFailed                        encryption.decryption_failed
    ├── DashboardRefusal                        web.refused
    │   ├── AuthorizeHookMissing                web.authorize_missing
    │   ├── DashboardReadOnly                   web.read_only
    │   ├── CsrfRejected                        web.csrf_rejected
    │   │   ├── CrossOriginRejected             web.cross_origin_rejected
    │   │   └── OriginMissing                   web.origin_missing
    │   └── ActionForbidden                     web.action_forbidden
    └── StoreError                              db.query_failed
        ├── ConnectionFailed                    db.connection_failed
        │   ├── DatabaseWaitTimeout             db.wait_timeout
        │   └── CommitOutcomeUnknown            db.commit_outcome_unknown
        ├── UniqueViolation                     db.unique_violation
        ├── RelatedResourceMissing              db.related_resource_missing
        ├── DefinitionNotFound                  job.definition_not_found
        ├── RelatedResourceStillReferenced      db.related_resource_still_referenced
        ├── BusinessRuleViolation               db.business_rule_violation
        ├── RequiredFieldMissing                db.required_field_missing
        ├── PermissionDenied                    db.permission_denied
        ├── WorkflowLinkageSymmetryViolation    workflow.linkage_symmetry_violation
        ├── WorkflowLinkageTriggerTableInvalid  workflow.linkage_symmetry_trigger_table_invalid
        ├── MigrationFailed                     db.migration_failed
        │   ├── SchemaManagedByHost             db.schema_managed_by_host
        │   └── OfflineMigrationUnsupported     db.offline_migration_unsupported
        └── SchemaMismatch                      db.schema_mismatch

    JobCancelled (BaseException)                job.cancelled

``JobCancelled`` sits outside the tree on purpose: it derives from
``BaseException`` so that a handler's ``except Exception`` cannot swallow the
worker's request to stop.

Each class's docstring is its default message. This module defines the base
and the branches' roots, and the leaves of no family. Each family lives in one
module of its own, which imports its bases from here (never the other way), and
is imported from there: the workflow classes (every ``workflow.*`` code) from
:mod:`runledger_sync.core.workflow_errors`, the ``web.*`` errors from
:mod:`runledger_sync.core.dashboard_errors`, the ``StoreError`` branch (but its
workflow leaves) from :mod:`runledger_sync.core.store_errors`, the flow-control
errors (``queue.*``, and the concurrency key's) from
:mod:`runledger_sync.core.queue_errors`, a unique job's and a debounce's from
:mod:`runledger_sync.core.coordination_errors`, the ``RegistrationError`` leaves (a
handler refused when it is registered) from
:mod:`runledger_sync.core.registry_errors`, a bulk action's (a filter or an update refused)
from :mod:`runledger_sync.core.bulk_errors`, the ``encryption.*`` errors from
:mod:`runledger_sync.core.encryption_errors`.
"""

from __future__ import annotations

from typing import Any, Optional

from runledger_sync.core.shapes import echo_or_shape, json_problem, type_phrase


class RunledgerError(Exception):
    """A runledger-sync operation failed."""

    code = "runledger.error"
    #: One of ``validation``, ``forbidden``, ``conflict``, ``internal``: how a
    #: caller (an HTTP API, the CLI) should classify the failure.
    category = "internal"

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or (self.__doc__ or self.code).strip()
        self.details = details
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ConfigError(RunledgerError):
    """The jobs configuration is invalid."""

    code = "config.invalid"
    category = "validation"

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems) or None, problems=self.problems)


def extra_install_hint(extra: str) -> str:
    """Say how to install one of runledger-sync's extras.

    The package is installed from a clone (it is not on PyPI), so a bare
    ``pip install 'runledger-sync[extra]'`` would fail: the hint names the extra
    and the command that works in a clone.
    """
    return f"install runledger-sync's {extra} extra (in a clone of runledger-sync: pip install -e '.[{extra}]')"


class MissingExtra(ConfigError):
    """This feature needs an optional dependency that is not installed."""

    code = "config.missing_extra"

    def __init__(self, extra: str, module: str) -> None:
        super().__init__([f"{module} is not installed; {extra_install_hint(extra)}"])
        self.extra = extra
        self.module = module


class RegistrationError(RunledgerError):
    """A job handler could not be registered."""

    code = "registry.invalid_registration"
    category = "validation"


class ValidationError(RunledgerError):
    """An argument was rejected before the database was touched."""

    code = "runledger.validation_failed"
    category = "validation"


class InvalidArgument(ValidationError):
    """An argument is out of its allowed range."""

    code = "job.invalid_argument"

    def __init__(self, argument: str, value: Any, expectation: str) -> None:
        self.argument = argument
        self.value = value
        # Only a short scalar is repeated: a dict or list given here may be a
        # payload passed in the wrong place.
        super().__init__(
            f"{argument} must be {expectation}, got {echo_or_shape(value)}",
            argument=argument,
        )


class InvalidJobType(InvalidArgument):
    """The job type is blank, too long or not text."""

    code = "job.invalid_job_type"


class InvalidPayload(InvalidArgument):
    """The payload is not a JSON value."""

    code = "job.invalid_payload"

    def __init__(self, argument: str, value: Any, expectation: str, *, got: Optional[str] = None) -> None:
        # Payloads, outputs and checkpoints may hold secrets, and this message
        # reaches logs and job rows: it names the value's shape, never its content.
        shape = got if got is not None else (json_problem(value) or type_phrase(value))
        self.argument = argument
        self.value = shape
        ValidationError.__init__(self, f"{argument} must be {expectation}, got {shape}", argument=argument)


class OutputTooLarge(InvalidPayload):
    """An output (a job's, or an external step's answer) is larger than the output limit."""

    code = "job.output_too_large"


class CheckpointTooLarge(InvalidPayload):
    """A checkpoint is larger than the payload limit: a job's saved progress is read back whole at each run, as its payload is."""

    code = "job.checkpoint_too_large"


class InvalidMeta(InvalidArgument):
    """Job metadata is not a small object of text keys and text values."""

    code = "job.invalid_meta"

    def __init__(self, argument: str, value: Any, expectation: str, *, got: Optional[str] = None) -> None:
        # Metadata may carry tokens (a trace context, a tenant): the message names a
        # key or the value's type and size, never a value.
        shape = got if got is not None else type_phrase(value)
        self.argument = argument
        self.value = shape
        ValidationError.__init__(self, f"{argument} must be {expectation}, got {shape}", argument=argument)


class InvalidCompletionProgress(ValidationError):
    """Completion progress is negative or done exceeds total."""

    code = "job.invalid_completion_progress"


class InvalidProgress(ValidationError):
    """Progress is negative or done exceeds total."""

    code = "job.invalid_progress"


class InvalidLeaseDuration(ValidationError):
    """The lease duration must be a positive number of seconds."""

    code = "job.invalid_lease_duration"


class InvalidRetryDelay(ValidationError):
    """The retry delay must be a positive number of milliseconds."""

    code = "job.invalid_retry_delay"


class InvalidCron(ValidationError):
    """The schedule's cron expression cannot be parsed or never fires."""

    code = "schedule.invalid_cron"


class InvalidTimezone(ValidationError):
    """The schedule's time zone is not an IANA zone name this machine knows."""

    code = "schedule.invalid_timezone"


class EnqueueIdempotencyUnsupportedIsolation(ValidationError):
    """Idempotent enqueue needs a READ COMMITTED transaction."""

    code = "job.enqueue_idempotency_unsupported_isolation"


class CompareAndRequeueUnsupportedIsolation(ValidationError):
    """A requeue with expectations needs a READ COMMITTED transaction (it re-reads the row it waited for)."""

    code = "job.compare_and_requeue_unsupported_isolation"


class JobStateError(RunledgerError):
    """The job is not in a state that allows this operation."""

    code = "runledger.job_state_rejected"
    category = "validation"


class LeaseOwnerMismatch(JobStateError):
    """The job's lease no longer belongs to this worker or has expired."""

    code = "job.lease_owner_mismatch"
    category = "forbidden"


class UnstartedClaimReleaseNotApplicable(JobStateError):
    """The claim cannot be released: RUNNING was persisted or it is not a prestart claim."""

    code = "job.unstarted_claim_release_not_applicable"


class InvalidStateTransition(JobStateError):
    """The job's status does not allow this transition."""

    code = "job.invalid_state_transition"


class JobNotFound(JobStateError):
    """No job with this id exists in the caller's scope."""

    code = "job.not_found"


class ScheduleNotFound(JobStateError):
    """No schedule has this name."""

    code = "schedule.not_found"


class ScheduleDeclaredInCode(JobStateError):
    """The schedule is declared in code, which would write it again: remove it there, or pause it."""

    code = "schedule.declared_in_code"


class DefinitionNotFoundOrDisabled(JobStateError):
    """The job type has no enabled definition."""

    code = "job.definition_not_found_or_disabled"


class WorkflowRequeueNotSupported(JobStateError):
    """A workflow-managed job cannot be requeued on its own."""

    code = "job.workflow_requeue_not_supported"


class ConflictError(RunledgerError):
    """The request conflicts with an existing job."""

    code = "runledger.conflict"
    category = "conflict"


class AlreadyEnqueued(ConflictError):
    """A job with this idempotency key already exists."""

    code = "job.already_enqueued"


class RequeueExpectationFailed(ConflictError):
    """The job is no longer in the status or run the requeue expected: somebody moved it first."""

    code = "job.requeue_expectation_failed"


class IdempotencyConflict(ConflictError):
    """A job with this idempotency key exists with a different request."""

    code = "job.idempotency_conflict"


class IdempotencyConflictMissingExisting(ConflictError):
    """The idempotency key conflicted but the existing job could not be found."""

    code = "job.idempotency_conflict_missing_existing"
    category = "internal"


class LegacyIdempotencySnapshotMissing(ConflictError):
    """The existing job with this idempotency key has no request snapshot to compare."""

    code = "job.legacy_idempotency_snapshot_missing"


class JobWaitTimeout(RunledgerError):
    """The job did not end (SUCCEEDED, DEAD_LETTERED or CANCELED) within the time given to wait for it."""

    code = "job.wait_timeout"


class JobCancelled(BaseException):
    """The worker asked the handler to stop (deadline, lease loss or operator cancel)."""

    code = "job.cancelled"

    def __init__(self, reason: str = "cancelled") -> None:
        self.reason = reason
        super().__init__(f"{self.code}: {reason}")

