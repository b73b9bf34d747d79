"""The Alembic page's two setups, followed as written in projects that ``alembic init`` makes.

Each test starts from ``alembic init alembic`` (this environment's ``alembic`` console
script, importing runledger_sync from this clone), puts the page's ``env.py`` and
``alembic.ini`` keys in place, runs the page's commands in order against an empty
database, and checks what they leave there.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy

import runledger_sync as rl
from runledger_sync.db.alembic_host import RUNLEDGER_TABLES
from runledger_sync.db.migrate import VERSION_TABLE
from tests.db.test_docs import marked, shell_lines

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: Every table runledger's history creates (its version table aside).
QUEUE_TABLES = RUNLEDGER_TABLES - {VERSION_TABLE}
MODELS = (
    'import sqlalchemy as sa\n\nmetadata = sa.MetaData()\n'
    'sa.Table("users", metadata, sa.Column("id", sa.BigInteger(), primary_key=True))\n'
)
NOT_EXCLUDED = "pass include_object=include_object"


@pytest.fixture(scope="module")
def initialised(tmp_path_factory) -> Path:
    """A project as ``alembic init alembic`` writes it, made once and copied by each test."""
    project = tmp_path_factory.mktemp("alembic_init") / "project"
    project.mkdir()
    ok(subprocess.run([str(BIN / "alembic"), "init", "alembic"], cwd=project, env=environment(),
                      capture_output=True, text=True, timeout=60))
    return project


def environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RUNLEDGER_", "PYTHON"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def project(initialised: Path, tmp_path: Path, database_url: str, env_py: str, ini_block: str | None = None) -> Path:
    """A copy of the initialised project set up as the page says: its env.py, its ``[alembic]`` keys, your URL."""
    root = tmp_path / "project"
    shutil.copytree(initialised, root)
    (root / "myapp").mkdir()
    (root / "myapp" / "__init__.py").write_text("", encoding="utf-8")
    (root / "myapp" / "models.py").write_text(MODELS, encoding="utf-8")
    (root / "alembic" / "env.py").write_text(env_py, encoding="utf-8")
    ini = configparser.RawConfigParser()
    ini.read(root / "alembic.ini", encoding="utf-8")
    ini.set("alembic", "sqlalchemy.url", database_url)
    if ini_block is not None:
        keys = configparser.RawConfigParser()
        keys.read_string(ini_block)
        for key, value in keys.items("alembic"):
            ini.set("alembic", key, value)
    with open(root / "alembic.ini", "w", encoding="utf-8") as file:
        ini.write(file)
    return root


def run(root: Path, line: str) -> subprocess.CompletedProcess:
    """One command line of the page, with this environment's ``alembic``."""
    tool, *argv = shlex.split(line)
    assert tool == "alembic", line
    return subprocess.run([str(BIN / tool), *argv], cwd=root, env=environment(), capture_output=True, text=True,
                          timeout=60)


def page_commands(marker: str) -> list[str]:
    return shell_lines(marked(marker, "sh"))


@pytest.fixture
def engine(empty_database):
    engine = sqlalchemy.create_engine(empty_database, poolclass=sqlalchemy.pool.NullPool)
    yield engine
    engine.dispose()


def tables(engine: sqlalchemy.Engine) -> set[str]:
    return set(sqlalchemy.inspect(engine).get_table_names())


def versions(engine: sqlalchemy.Engine, table: str) -> set[str]:
    with engine.connect() as conn:
        return set(conn.exec_driver_sql(f"SELECT version_num FROM {table}").scalars())


def written_revision(root: Path) -> str:
    """The text of the one revision file in the project's own versions directory."""
    (path,) = (root / "alembic" / "versions").glob("*.py")
    return path.read_text(encoding="utf-8")


def upgrade_body(revision_text: str) -> str:
    return revision_text.split("def upgrade()", 1)[1].split("def downgrade()", 1)[0]


def names_a_runledger_table(text: str) -> bool:
    return any(re.search(rf"\b{name}\b", text) for name in RUNLEDGER_TABLES)


# -- our own version table ---------------------------------------------------------------------------------


def test_own_version_table_as_the_page_says(initialised, tmp_path, empty_database, engine):
    root = project(initialised, tmp_path, empty_database, marked("alembic-env", "python"))
    commands = page_commands("alembic-env-commands")
    # The checks below follow the page's order.
    assert [line.split()[:2] for line in commands] == [["alembic", "revision"], ["alembic", "upgrade"], ["alembic", "check"]]
    autogenerate, upgrade, check = commands

    result = ok(run(root, autogenerate))

    # On a new database: your revision only, and nothing of ours created.
    assert tables(engine) & RUNLEDGER_TABLES == set()
    revision = written_revision(root)
    assert "op.create_table('users'" in upgrade_body(revision) and not names_a_runledger_table(revision)
    assert "runledger's tables are absent" in result.stderr and "`alembic upgrade head` migrates them" in result.stderr
    assert NOT_EXCLUDED not in result.stderr

    ok(run(root, upgrade))

    assert {"users", "alembic_version"} | RUNLEDGER_TABLES <= tables(engine)
    assert versions(engine, VERSION_TABLE) == {rl.head_revision()}
    assert len(versions(engine, "alembic_version")) == 1
    result = ok(run(root, check))
    assert "No new upgrade operations detected." in result.stdout + result.stderr
    assert "runledger's tables" not in result.stderr  # at head: nothing to say


def test_autogenerate_without_include_object_warns_naming_the_fix(initialised, tmp_path, empty_database, engine):
    env_py = marked("alembic-env", "python")
    forgotten = env_py.replace(",\n                          include_object=include_object)", ")")
    assert forgotten != env_py
    root = project(initialised, tmp_path, empty_database, forgotten)
    ok(run(root, "alembic upgrade head"))

    result = ok(run(root, 'alembic revision --autogenerate -m "probe"'))

    assert NOT_EXCLUDED in result.stderr, result.stderr
    assert f"runledger's tables ({len(RUNLEDGER_TABLES)} of them" in result.stderr
    # What the warning is about: the revision drops them.
    assert "op.drop_table('job_queue')" in upgrade_body(written_revision(root))


def test_autogenerate_with_your_own_filter_that_calls_include_object_does_not_warn(
    initialised, tmp_path, empty_database, engine
):
    env_py = marked("alembic-env", "python")
    combined = env_py.replace("include_object=include_object)",
                              "include_object=lambda *item: include_object(*item) and item[1] != 'legacy')")
    assert combined != env_py
    root = project(initialised, tmp_path, empty_database, combined)

    # The warning asks the configured filters, so it needs none of our tables in the database.
    result = ok(run(root, 'alembic revision --autogenerate -m "probe"'))

    assert NOT_EXCLUDED not in result.stderr


# -- one history -------------------------------------------------------------------------------------------


def one_history(initialised: Path, tmp_path: Path, database_url: str, ini_block: str | None = None) -> Path:
    return project(initialised, tmp_path, database_url, marked("alembic-one-history-env", "python"),
                   marked("alembic-one-history-ini", "ini") if ini_block is None else ini_block)


def test_one_history_as_the_page_says(initialised, tmp_path, empty_database, engine):
    root = one_history(initialised, tmp_path, empty_database)
    commands = page_commands("alembic-one-history-commands")
    assert [line.split()[:2] for line in commands] == [
        ["alembic", "upgrade"], ["alembic", "revision"], ["alembic", "upgrade"], ["alembic", "check"]]
    first_upgrade, autogenerate, upgrade, check = commands
    # Autogenerate before the first upgrade is refused, as the page says, and creates nothing of ours.
    refused = run(root, autogenerate)
    assert refused.returncode != 0 and "Target database is not up to date" in refused.stderr
    assert tables(engine) & RUNLEDGER_TABLES == set()

    ok(run(root, first_upgrade))

    assert QUEUE_TABLES <= tables(engine) and VERSION_TABLE not in tables(engine)
    assert versions(engine, "alembic_version") == {rl.head_revision()}

    result = ok(run(root, autogenerate))

    revision = written_revision(root)  # in the project's directory, not the package's
    assert re.search(rf"^down_revision\b.*= '{rl.head_revision()}'$", revision, re.M)
    assert "op.create_table('users'" in upgrade_body(revision) and not names_a_runledger_table(revision)
    assert NOT_EXCLUDED not in result.stderr
    ok(run(root, upgrade))
    assert {"users"} | QUEUE_TABLES <= tables(engine)
    result = ok(run(root, check))
    assert "No new upgrade operations detected." in result.stdout + result.stderr


def test_one_history_without_our_versions_fails_the_upgrade_and_keeps_nothing(
    initialised, tmp_path, empty_database, engine
):
    ini_block = marked("alembic-one-history-ini", "ini")
    without_ours = ini_block.replace("\n    runledger_sync:_alembic/versions", "")
    assert without_ours != ini_block
    root = one_history(initialised, tmp_path, empty_database, without_ours)

    result = run(root, "alembic upgrade head")

    assert result.returncode != 0
    assert "config.invalid: your Alembic history does not hold runledger-sync's migrations" in result.stderr
    assert "list runledger_sync:_alembic/versions in version_locations" in result.stderr
    assert tables(engine) == set()  # not even alembic_version: the transaction was rolled back


def test_one_history_at_your_head_with_our_tables_off_head_fails_and_keeps_nothing(
    initialised, tmp_path, empty_database, engine
):
    root = one_history(initialised, tmp_path, empty_database)
    ok(run(root, "alembic upgrade head"))
    (root / "alembic" / "versions" / "u1_users.py").write_text(
        f'import sqlalchemy as sa\nfrom alembic import op\n\nrevision = "u1"\ndown_revision = "{rl.head_revision()}"\n'
        "branch_labels = None\ndepends_on = None\n\n\ndef upgrade():\n"
        '    op.create_table("users", sa.Column("id", sa.BigInteger(), primary_key=True))\n\n\n'
        'def downgrade():\n    op.drop_table("users")\n',
        encoding="utf-8",
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE job_rollup_minutes")

    result = run(root, "alembic upgrade head")

    assert result.returncode != 0
    assert "db.schema_mismatch: " in result.stderr and "job_rollup_minutes" in result.stderr, result.stderr
    assert "users" not in tables(engine)
    assert versions(engine, "alembic_version") == {rl.head_revision()}
