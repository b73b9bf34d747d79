"""The database branch of the exception tree: what the store raises when a statement or migration fails.

``store/transactions.py`` maps SQLAlchemy and psycopg2 errors to these classes. The
tree is drawn in :mod:`runledger_sync.core.errors`, which holds the base; import
these classes from here (or from ``runledger_sync``).
"""

from __future__ import annotations

from runledger_sync.core.errors import RunledgerError


class StoreError(RunledgerError):
    """A database statement failed."""

    code = "db.query_failed"


class ConnectionFailed(StoreError):
    """The database could not be reached."""

    code = "db.connection_failed"


class DatabaseWaitTimeout(ConnectionFailed):
    """The database did not answer within the time a worker was given to wait for it at start."""

    code = "db.wait_timeout"


class CommitOutcomeUnknown(ConnectionFailed):
    """The connection was lost while committing; the write may or may not have landed."""

    code = "db.commit_outcome_unknown"


class UniqueViolation(StoreError):
    """A unique constraint was violated."""

    code = "db.unique_violation"
    category = "conflict"


class RelatedResourceMissing(StoreError):
    """A referenced row does not exist."""

    code = "db.related_resource_missing"
    category = "validation"


class DefinitionNotFound(RelatedResourceMissing):
    """The job type has no definition."""

    code = "job.definition_not_found"


class RelatedResourceStillReferenced(StoreError):
    """The row is still referenced by other rows."""

    code = "db.related_resource_still_referenced"
    category = "validation"


class BusinessRuleViolation(StoreError):
    """A check constraint was violated."""

    code = "db.business_rule_violation"
    category = "validation"


class RequiredFieldMissing(StoreError):
    """A required column was NULL."""

    code = "db.required_field_missing"
    category = "validation"


class PermissionDenied(StoreError):
    """The database role lacks a privilege this operation needs."""

    code = "db.permission_denied"
    category = "forbidden"


class MigrationFailed(StoreError):
    """A schema migration failed."""

    code = "db.migration_failed"


class SchemaManagedByHost(MigrationFailed):
    """The queue tables are managed by your application's Alembic history; run `alembic upgrade head` there."""

    code = "db.schema_managed_by_host"


class OfflineMigrationUnsupported(MigrationFailed):
    """rl.migrate() needs a live connection; it cannot add the queue's DDL to an offline (`--sql`) Alembic script."""

    code = "db.offline_migration_unsupported"


class SchemaMismatch(StoreError):
    """The database schema is not at the revision this library expects."""

    code = "db.schema_mismatch"
