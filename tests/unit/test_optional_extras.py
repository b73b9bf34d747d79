"""The optional extras: the library imports without them, and what needs one says how to install it.

The package is installed from a clone (it is not on PyPI), so every hint names the
extra and the command that works in a clone, never ``pip install 'runledger-sync[...]'``.
"""

from __future__ import annotations

import subprocess
import re
import sys

import pytest

import runledger_sync as rl
from runledger_sync import cli, metrics
from runledger_sync.cli import dashboard
from runledger_sync.db import embedded

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
    assert caught.value.message == ("prometheus_client is not installed; install runledger-sync's metrics extra "
                                    "(in a clone of runledger-sync: pip install -e '.[metrics]')")


def test_worker_metrics_port_without_prometheus_client_is_refused_before_the_database(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)

    code = cli.main(["--database-url", "postgresql://nobody@127.0.0.1:1/none", "worker",
                     "--app", "tests.cli_app:registry", "--metrics-port", "9100"])

    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert lines[0] == ("error: config.missing_extra: prometheus_client is not installed; "
                        "install runledger-sync's metrics extra (in a clone of runledger-sync: pip install -e '.[metrics]')")


def test_top_without_rich_is_refused_before_the_database(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich", None)

    code = cli.main(["--database-url", "postgresql://nobody@127.0.0.1:1/none", "top", "--once"])

    assert code == 2
    assert ("error: config.missing_extra: rich is not installed; install runledger-sync's tui extra "
            "(in a clone of runledger-sync: pip install -e '.[tui]')") in capsys.readouterr().err


def test_the_dashboard_without_its_extra_says_how_to_install_it_in_a_clone(monkeypatch):
    monkeypatch.setitem(sys.modules, "runledger_sync.web", None)  # as when Jinja2 is missing

    with pytest.raises(rl.ConfigError) as caught:
        dashboard._create_app(None, None)

    assert caught.value.hint == "install runledger-sync's dashboard extra (in a clone of runledger-sync: pip install -e '.[dashboard]')"


@pytest.mark.parametrize("entry", [
    "sys.exit(cli.main(['--database-url', 'postgresql://nobody@127.0.0.1:1/none', 'dashboard', '--port', '0']))",
    "from runledger_sync.web import create_app",  # what the Flask and Django mounts import
])
def test_the_dashboard_without_jinja2_is_the_missing_extra_error_every_other_extra_gives(entry):
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.modules['jinja2'] = None; from runledger_sync import cli; {entry}"],
        capture_output=True, text=True, timeout=60,
    )

    assert result.returncode != 0
    assert ("config.missing_extra: Jinja2 is not installed; install runledger-sync's dashboard extra "
            "(in a clone of runledger-sync: pip install -e '.[dashboard]')") in result.stderr


def test_the_asyncio_api_without_greenlet_is_the_missing_extra_error():
    result = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['greenlet'] = None; from runledger_sync import aio"],
        capture_output=True, text=True, timeout=60,
    )

    assert result.returncode != 0
    assert ("config.missing_extra: greenlet is not installed; install runledger-sync's aio extra "
            "(in a clone of runledger-sync: pip install -e '.[aio]')") in result.stderr


def test_embedded_postgres_without_its_extra_says_how_to_install_it_in_a_clone(monkeypatch):
    monkeypatch.setitem(sys.modules, "pgserver", None)

    with pytest.raises(rl.ConfigError) as caught:
        embedded._load_pgserver()

    assert caught.value.message == ("embedded postgres needs pgserver: install runledger-sync's embedded extra "
                                    "(in a clone of runledger-sync: pip install -e '.[embedded]')")


@pytest.mark.parametrize("extra", ["metrics", "tui", "dashboard", "embedded", "aio"])
def test_every_install_hint_names_an_extra_the_clone_defines_and_no_package_index(extra):
    hint = rl.MissingExtra(extra, "module").message

    assert f"pip install -e '.[{extra}]'" in hint
    assert "pip install 'runledger-sync[" not in hint  # not on PyPI: that command fails
    assert extra in setup_extras()


def setup_extras() -> set[str]:
    import configparser
    from pathlib import Path

    parser = configparser.ConfigParser()
    parser.read(Path(__file__).resolve().parents[2] / "setup.cfg", encoding="utf-8")
    return set(parser["options.extras_require"])


def test_top_refuses_an_interval_of_zero(capsys):
    code = cli.main(["--database-url", "postgresql://nobody@127.0.0.1:1/none", "top", "--interval", "0"])

    assert code == 2
    assert "--interval must be a number of seconds above 0, got 0.0" in capsys.readouterr().err


def test_without_opentelemetry_nothing_imports_it_and_the_integration_says_what_to_install():
    script = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import runledger_sync, runledger_sync.middleware, runledger_sync.store.enqueue.enqueue, runledger_sync.runtime.worker.loop\n"
        "try:\n"
        "    import runledger_sync.contrib.opentelemetry\n"
        "except runledger_sync.MissingExtra as error:\n"
        "    print(error.code, error.message)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("config.missing_extra opentelemetry-api is not installed; install runledger-sync's "
                                    "otel extra")


def test_aio_enqueue_takes_every_keyword_of_the_sync_enqueue():
    import inspect

    pytest.importorskip("greenlet")
    from runledger_sync import aio
    from runledger_sync.store.enqueue import enqueue as store_enqueue

    def keywords(fn):
        return {name: parameter.default for name, parameter in inspect.signature(fn).parameters.items()
                if parameter.kind is inspect.Parameter.KEYWORD_ONLY}

    # Spelled out for the reader of the async API, so a keyword added to one must be added to the other.
    assert keywords(aio.enqueue) == keywords(store_enqueue.enqueue)


@pytest.mark.parametrize("page, pattern", [("README.md", r"`([\w-]+)`\s+\("), ("docs/getting-started.md", r"^\| `([\w-]+)` \|")],
                         ids=["README", "getting-started"])
def test_the_install_docs_name_every_extra_a_user_installs(page, pattern):
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / page).read_text(encoding="utf-8")
    section = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert setup_extras() - {"dev"} <= set(re.findall(pattern, section, re.M))
