"""Which driver answers count as a lost connection: one rule for the store and for handlers."""

from __future__ import annotations

import psycopg2
import pytest
from sqlalchemy import exc as sa_exc

from runledger_sync.core.store_errors import ConnectionFailed
from runledger_sync.db.connection_loss import means_connection_loss, refused_unwritten
from runledger_sync.db.errors import is_connection_loss, is_transient, translate


class DriverError(psycopg2.Error):
    """A driver error as a server sends it: psycopg2 fills ``pgcode`` from the answer, read-only here."""

    def __init__(self, pgcode):
        super().__init__(f"server answered {pgcode}")
        self._pgcode = pgcode

    @property
    def pgcode(self):  # type: ignore[override]
        return self._pgcode


FAILOVER_STATES = ["25006", "57P01", "57P02", "57P03", "08006", "08001"]
ORDINARY_STATES = ["23505", "40001", "40P01", "42P01", "25001", "55P03", "57014"]


@pytest.mark.parametrize("state", FAILOVER_STATES)
def test_a_failovers_answers_are_a_lost_connection_everywhere(state):
    assert means_connection_loss(state)
    wrapped = sa_exc.InternalError("INSERT ...", {}, DriverError(state))
    assert is_transient(wrapped)
    assert is_connection_loss(wrapped)  # a handler's own use of the database
    assert isinstance(translate(wrapped), ConnectionFailed)


@pytest.mark.parametrize("state", ORDINARY_STATES)
def test_other_answers_are_failures_of_the_statement(state):
    # 57014 is a statement timeout (query_canceled): the connection is fine.
    assert not means_connection_loss(state)
    wrapped = sa_exc.InternalError("INSERT ...", {}, DriverError(state))
    assert not is_transient(wrapped)
    assert not is_connection_loss(wrapped)
    assert not isinstance(translate(wrapped), ConnectionFailed)


def test_only_a_refusal_says_nothing_was_written():
    assert refused_unwritten("25006") and refused_unwritten("57P03")
    # A shutdown may end a session whose commit had landed.
    assert not refused_unwritten("57P01") and not refused_unwritten("08006") and not refused_unwritten(None)


def test_a_driver_error_a_handler_raised_itself_counts_by_its_sqlstate():
    class ReadOnly(psycopg2.OperationalError):
        pgcode = "25006"

    class Deadlock(psycopg2.OperationalError):
        pgcode = "40P01"

    class ReadOnlyInternal(psycopg2.InternalError):  # how psycopg2 raises 25006
        pgcode = "25006"

    assert is_connection_loss(ReadOnly()) and is_connection_loss(ReadOnlyInternal())
    assert not is_connection_loss(Deadlock())
    assert not is_connection_loss(DriverError("23505"))
    # psycopg2 reports a dropped socket with no SQLSTATE at all.
    assert is_connection_loss(psycopg2.OperationalError("server closed the connection unexpectedly"))
    assert not is_connection_loss(OSError("refused"))
