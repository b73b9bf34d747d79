"""The metrics and tui extras are optional: the library imports without them, and what needs them says so."""

from __future__ import annotations

import subprocess
import sys

import pytest

import runledger_sync as rl
from runledger_sync import cli, metrics

BLOCK_EXTRAS = "import sys; sys.modules.update(prometheus_client=None, rich=None); "


def test_the_library_and_its_console_script_import_without_the_extras():
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_EXTRAS + "import runledger_sync, runledger_sync.metrics, runledger_sync.cli; "
                                              "print(len(runledger_sync.cli.COMMANDS))"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(cli.COMMANDS)


def test_worker_metrics_without_prometheus_client_is_a_coded_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)

    with pytest.raises(rl.MissingExtra) as caught:
        metrics.WorkerMetrics()

    assert caught.value.code == "config.missing_extra"
    assert "pip install 'runledger-sync[metrics]'" in caught.value.message


def test_worker_metrics_port_without_prometheus_client_is_refused_before_the_database(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)

    code = cli.main(["--database-url", "postgresql://nobody@127.0.0.1:1/none", "worker",
                     "--app", "tests.cli_app:registry", "--metrics-port", "9100"])

    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert lines[0] == ("error: config.missing_extra: prometheus_client is not installed; "
                        "install it with: pip install 'runledger-sync[metrics]'")


def test_top_without_rich_is_refused_before_the_database(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich", None)

    code = cli.main(["--database-url", "postgresql://nobody@127.0.0.1:1/none", "top", "--once"])

    assert code == 2
    assert "error: config.missing_extra: rich is not installed; install it with: pip install 'runledger-sync[tui]'" \
        in capsys.readouterr().err


def test_top_refuses_an_interval_of_zero(capsys):
    code = cli.main(["--database-url", "postgresql://nobody@127.0.0.1:1/none", "top", "--interval", "0"])

    assert code == 2
    assert "--interval must be a number of seconds above 0, got 0.0" in capsys.readouterr().err
