"""The errors of operator actions on many jobs: a filter or an update refused, a rule that leaves a job out.

A refused filter or update is raised before any SQL runs, so nothing is
counted, changed or recorded. A job a lifecycle rule leaves out of a bulk
action is not raised: it is counted in ``BulkResult.skipped`` under the code of
the rule (``job.workflow_requeue_not_supported`` for a retry, the code below
for a delete).
"""

from __future__ import annotations

from runledger_sync.core.errors import InvalidArgument, JobStateError


class InvalidJobFilter(InvalidArgument):
    """A job filter is malformed: an unknown status, a blank type, a naive datetime, an empty list."""

    code = "job.invalid_filter"


class EmptyJobFilter(InvalidJobFilter):
    """A bulk action was given a filter that names nothing: name at least one criterion (``statuses=`` for every job)."""

    code = "job.empty_filter"


class InvalidJobUpdate(InvalidArgument):
    """A bulk update sets nothing, or sets a priority out of range or a naive ``run_at``."""

    code = "job.invalid_update"


class WorkflowDeleteNotSupported(JobStateError):
    """A workflow's job is deleted with its run (by retention), never on its own."""

    code = "job.workflow_delete_not_supported"
