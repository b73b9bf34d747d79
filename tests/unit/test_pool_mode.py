"""The pool mode: parsed from every place it can be set, refused with the allowed values."""

from __future__ import annotations

import pytest

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.db.pool_mode import ConnectionPolicy, parse_pool_mode, pool_mode_from_env


def test_pool_modes_parse_whatever_their_case_and_blanks():
    assert parse_pool_mode(" Transaction ") is rl.PoolMode.TRANSACTION
    assert parse_pool_mode(rl.PoolMode.SESSION) is rl.PoolMode.SESSION
    assert pool_mode_from_env({"RUNLEDGER_POOL_MODE": "session"}) is rl.PoolMode.SESSION
    assert pool_mode_from_env({"RUNLEDGER_POOL_MODE": "  "}) is None
    with pytest.raises(rl.ConfigError, match="RUNLEDGER_POOL_MODE must be one of session, transaction, got 'statement'"):
        pool_mode_from_env({"RUNLEDGER_POOL_MODE": "statement"})


def test_a_session_policy_turns_shared_once_and_a_transaction_policy_is_shared_from_the_start():
    policy = ConnectionPolicy(rl.PoolMode.SESSION)
    assert policy.prepares and policy.listens
    assert policy.mark_sessions_shared() is True
    assert policy.mark_sessions_shared() is False
    assert not policy.prepares and not policy.listens
    transaction = ConnectionPolicy(rl.PoolMode.TRANSACTION)
    assert not transaction.prepares and not transaction.listens
    assert transaction.mark_sessions_shared() is False


def test_cli_refuses_a_bad_pool_mode_variable_with_a_hint_and_a_bad_option_as_usage(monkeypatch, capsys):
    monkeypatch.setenv("RUNLEDGER_POOL_MODE", "statement")
    assert cli.main(["--database-url", "postgresql://app@127.0.0.1:1/app", "stats"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: config.invalid: RUNLEDGER_POOL_MODE must be one of session, transaction, got 'statement'"
    assert err[1].startswith("hint: set RUNLEDGER_POOL_MODE (or --pool-mode)")
    assert cli.main(["--pool-mode", "statement", "stats"]) == 2
    assert "invalid choice: 'statement'" in capsys.readouterr().err


def test_a_policy_travels_to_a_worker_process_with_what_it_learnt():
    import pickle

    from runledger_sync.db.pool_mode import ConnectionPolicy, PoolMode

    learnt = ConnectionPolicy(PoolMode.SESSION)
    learnt.mark_sessions_shared()
    copy = pickle.loads(pickle.dumps(learnt))  # noqa: S301 - our own bytes, as multiprocessing sends them
    assert (copy.mode, copy.sessions_shared, copy.prepares) == (PoolMode.SESSION, True, False)
    fresh = pickle.loads(pickle.dumps(ConnectionPolicy(PoolMode.SESSION)))  # noqa: S301 - our own bytes
    assert (fresh.sessions_shared, fresh.mark_sessions_shared()) == (False, True)
