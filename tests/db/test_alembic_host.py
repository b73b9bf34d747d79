"""A host application's own Alembic, run as its users run it: the ``alembic`` console script.

Option 1 of the README's "Schema and Alembic" is the README's env.py, which
calls ``rl.migrate(connection)``; option 2 is ``examples/alembic_host``, whose
alembic.ini lists our versions as the installed package's resource. Each test
starts from an empty database. Most subprocesses import runledger_sync from a
copy laid out as the wheel installs it (setup.cfg maps ``alembic/`` to
``runledger_sync/_alembic``); the clone's own layout, where
``runledger_sync/_alembic`` is a symlink to ``alembic/``, runs too.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy

import runledger_sync as rl
from runledger_sync.db.migrate import VERSION_TABLE, migrations_directory
from tests.db.test_readme import readme_snippet

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
QUEUE_TABLES = {"job_definitions", "job_queue", "job_attempts", "job_events", "job_dead_letters"}
#: The example host's newest revision: its merge of runledger-sync's newest.
HOST_HEAD = "app_0011"
NO_CHANGES = "No new upgrade operations detected."


@pytest.fixture(scope="session")
def installed_site(tmp_path_factory) -> Path:
    """A directory holding runledger_sync as the wheel lays it out, for PYTHONPATH."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    package_dir = dict(
        (part.strip() for part in line.split("=", 1))
        for line in setup["options"]["package_dir"].strip().splitlines()
    )
    site = tmp_path_factory.mktemp("site")
    ignore = shutil.ignore_patterns("__pycache__")
    # Without the clone's symlink: the wheel's copy comes from package_dir, as setuptools builds it.
    shutil.copytree(REPO / "runledger_sync", site / "runledger_sync", ignore=shutil.ignore_patterns("__pycache__", "_alembic"))
    shutil.copytree(REPO / package_dir["runledger_sync._alembic"], site / "runledger_sync" / "_alembic", ignore=ignore)
    return site


def test_the_clones_migrations_link_is_the_directory_the_wheel_bundles():
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    bundled = dict(
        (part.strip() for part in line.split("=", 1))
        for line in setup["options"]["package_dir"].strip().splitlines()
    )["runledger_sync._alembic"]

    link = REPO / "runledger_sync" / "_alembic"
    assert link.is_symlink() and link.resolve() == (REPO / bundled).resolve()
    assert migrations_directory() == (REPO / bundled).resolve()


def run(tool: str, host: Path, site: Path | None, database_url: str, *argv: str) -> subprocess.CompletedProcess:
    """Run ``tool`` of this environment in ``host``, importing runledger_sync from ``site`` (None: as installed)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RUNLEDGER_", "PYTHON"))}
    env.update(APP_DATABASE_URL=database_url)
    if site is not None:
        env.update(PYTHONPATH=str(site))
    return subprocess.run([str(BIN / tool), *argv], cwd=host, env=env, capture_output=True, text=True, timeout=120)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def tables(engine: sqlalchemy.Engine) -> set[str]:
    return set(sqlalchemy.inspect(engine).get_table_names())


def versions(engine: sqlalchemy.Engine, table: str) -> set[str]:
    with engine.connect() as conn:
        return set(conn.exec_driver_sql(f"SELECT version_num FROM {table}").scalars())


@pytest.fixture
def engine(empty_database):
    engine = sqlalchemy.create_engine(empty_database, poolclass=sqlalchemy.pool.NullPool)
    yield engine
    engine.dispose()


def new_revision_file(host: Path, before: set[Path]) -> Path:
    created = set((host / "versions").glob("*.py")) - before
    assert len(created) == 1, created
    return created.pop()


def take_revision_file(host: Path, before: set[Path]) -> str:
    """The text of the one revision file written since ``before``, removed so later commands see the old history."""
    path = new_revision_file(host, before)
    text = path.read_text(encoding="utf-8")
    path.unlink()
    return text


def upgrade_body(revision_text: str) -> str:
    return revision_text.split("def upgrade()", 1)[1].split("def downgrade()", 1)[0]


# -- option 1: rl.migrate(connection) in the host's env.py ------------------------------------------------

OPTION_1_REVISION = '''"""Create app_users."""
import sqlalchemy as sa
from alembic import op

revision = "a1"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("app_users", sa.Column("id", sa.BigInteger(), primary_key=True))


def downgrade():
    op.drop_table("app_users")
'''


# The logging sections `alembic init` writes, which an env.py's fileConfig() reads.
ALEMBIC_INIT_LOGGING = """
[loggers]
keys = root,sqlalchemy,alembic

[handlers]
keys = console

[formatters]
keys = generic

[logger_root]
level = WARNING
handlers = console

[logger_sqlalchemy]
level = WARNING
handlers =
qualname = sqlalchemy.engine

[logger_alembic]
level = INFO
handlers =
qualname = alembic

[handler_console]
class = StreamHandler
args = (sys.stderr,)
level = NOTSET
formatter = generic

[formatter_generic]
format = %%(levelname)-5.5s [%%(name)s] %%(message)s
"""


@pytest.fixture
def option_1_host(tmp_path, empty_database) -> Path:
    """An application dir whose env.py is the README's, as written."""
    host = tmp_path / "host"
    (host / "versions").mkdir(parents=True)
    (host / "myapp").mkdir()
    (host / "alembic.ini").write_text(
        "[alembic]\nscript_location = %(here)s\npath_separator = os\nprepend_sys_path = .\n"
        f"sqlalchemy.url = {empty_database.replace('%', '%%')}\n" + ALEMBIC_INIT_LOGGING,
        encoding="utf-8",
    )
    (host / "env.py").write_text(textwrap.dedent(readme_snippet("alembic-env")), encoding="utf-8")
    shutil.copy(REPO / "examples" / "alembic_host" / "script.py.mako", host)
    (host / "myapp" / "__init__.py").write_text("", encoding="utf-8")
    (host / "myapp" / "models.py").write_text(
        "import sqlalchemy as sa\n\nmetadata = sa.MetaData()\n"
        'sa.Table("app_users", metadata, sa.Column("id", sa.BigInteger(), primary_key=True))\n',
        encoding="utf-8",
    )
    (host / "versions" / "a1_users.py").write_text(OPTION_1_REVISION, encoding="utf-8")
    return host


def test_option_1_every_alembic_command_works_and_both_version_tables_advance(
    option_1_host, installed_site, empty_database, engine
):
    def alembic(*argv: str) -> subprocess.CompletedProcess:
        return run("alembic", option_1_host, installed_site, empty_database, *argv)

    ok(alembic("upgrade", "head"))

    assert {"app_users", "alembic_version", VERSION_TABLE} | QUEUE_TABLES <= tables(engine)
    assert versions(engine, "alembic_version") == {"a1"}
    assert versions(engine, VERSION_TABLE) == {rl.head_revision()}
    # Every later command works too (each runs env.py, and so rl.migrate, again).
    for _ in range(2):
        assert "a1 (head)" in ok(alembic("current"))
    assert ok(alembic("heads")).strip() == "a1 (head)"
    assert "<base> -> a1 (head)" in ok(alembic("history"))
    assert NO_CHANGES in ok(alembic("check"))
    before = set((option_1_host / "versions").glob("*.py"))
    ok(alembic("revision", "--autogenerate", "-m", "probe"))
    assert "op." not in upgrade_body(take_revision_file(option_1_host, before))
    assert ok(run("runledger-sync", option_1_host, installed_site, empty_database,
                  "--database-url", empty_database, "check-schema")).startswith(f"schema at {rl.head_revision()}")

    ok(alembic("downgrade", "base"))

    # Your downgrade is yours: our tables stay, at head, in their own version table.
    assert "app_users" not in tables(engine)
    assert versions(engine, "alembic_version") == set()
    assert QUEUE_TABLES <= tables(engine)
    assert versions(engine, VERSION_TABLE) == {rl.head_revision()}

    ok(alembic("upgrade", "head"))
    assert versions(engine, "alembic_version") == {"a1"}


# -- option 2: our versions in the host's history ------------------------------------------------------------


@pytest.fixture
def option_2_host(tmp_path) -> Path:
    host = tmp_path / "alembic_host"
    shutil.copytree(REPO / "examples" / "alembic_host", host, ignore=shutil.ignore_patterns("__pycache__"))
    return host


def test_option_2_every_alembic_command_works_from_empty_to_head_and_back(
    option_2_host, installed_site, empty_database, engine
):
    def alembic(*argv: str) -> subprocess.CompletedProcess:
        return run("alembic", option_2_host, installed_site, empty_database, *argv)

    # heads and history never run env.py: alembic.ini alone must find our versions.
    heads = ok(alembic("heads")).strip().splitlines()
    assert len(heads) == 1 and heads[0].startswith(f"{HOST_HEAD} ") and heads[0].endswith("(head)")
    history = ok(alembic("history"))
    assert "(runledger)" not in history  # no label of ours spreads to the app's revisions
    assert "0001 -> app_0001" in history and "<base> -> 0001" in history and "-> app_0003" in history
    assert "-> app_0004" in history and f"-> {HOST_HEAD}" in history

    ok(alembic("upgrade", "head"))

    assert {"app_orders", "alembic_version"} | QUEUE_TABLES <= tables(engine)
    assert VERSION_TABLE not in tables(engine)
    assert versions(engine, "alembic_version") == {HOST_HEAD}
    assert f"{HOST_HEAD} (head)" in ok(alembic("current"))
    assert NO_CHANGES in ok(alembic("check"))
    before = set((option_2_host / "versions").glob("*.py"))
    ok(alembic("revision", "--autogenerate", "-m", "probe"))
    assert "op." not in upgrade_body(take_revision_file(option_2_host, before))
    ok(alembic("revision", "-m", "needs the queue", "--depends-on", rl.head_revision()))
    written = new_revision_file(option_2_host, before)
    assert re.search(rf"^depends_on\b.*= '{rl.head_revision()}'$", written.read_text(encoding="utf-8"), re.M)
    assert ok(alembic("heads")).startswith(written.name.split("_", 1)[0] + " ")
    written.unlink()

    # Our own commands read the host's table and create nothing.
    cli = run("runledger-sync", option_2_host, installed_site, empty_database, "--database-url", empty_database, "migrate")
    assert ok(cli) == f"schema at {rl.head_revision()} (already up to date)\n"
    cli = run("runledger-sync", option_2_host, installed_site, empty_database,
              "--database-url", empty_database, "check-schema")
    assert ok(cli) == f"schema at {rl.head_revision()} (up to date)\n"
    assert VERSION_TABLE not in tables(engine)

    ok(alembic("downgrade", "base"))

    assert not tables(engine) & ({"app_orders"} | QUEUE_TABLES)
    assert versions(engine, "alembic_version") == set()


@pytest.fixture
def new_host(tmp_path) -> Path:
    """A project set up as examples/alembic_host is, before it has a revision of its own."""
    host = tmp_path / "new_host"
    shutil.copytree(REPO / "examples" / "alembic_host", host, ignore=shutil.ignore_patterns("__pycache__", "versions"))
    (host / "versions").mkdir()
    return host


def revision_id(path: Path) -> str:
    return re.search(r"^revision\b.*= '([^']+)'$", path.read_text(encoding="utf-8"), re.M).group(1)


def test_option_2_a_new_projects_revisions_land_in_its_own_directory(new_host, installed_site, empty_database, engine):
    def alembic(*argv: str) -> subprocess.CompletedProcess:
        return run("alembic", new_host, installed_site, empty_database, *argv)

    ours = installed_site / "runledger_sync" / "_alembic" / "versions"
    shipped = sorted(path.name for path in ours.glob("*.py"))
    ok(alembic("upgrade", "head"))  # only runledger's history so far: its head is the only head

    ok(alembic("revision", "--autogenerate", "-m", "orders"))

    # Alembic alone would have written it next to our head, into the installed package.
    assert sorted(path.name for path in ours.glob("*.py")) == shipped
    first = new_revision_file(new_host, set())
    text = first.read_text(encoding="utf-8")
    assert re.search(rf"^down_revision\b.*= '{rl.head_revision()}'$", text, re.M)
    assert "op.create_table('app_orders'" in upgrade_body(text)

    # A plain revision too (alembic.ini's revision_environment runs env.py for it).
    ok(alembic("revision", "-m", "later"))
    second = new_revision_file(new_host, {first})
    assert re.search(rf"^down_revision\b.*= '{revision_id(first)}'$", second.read_text(encoding="utf-8"), re.M)
    assert sorted(path.name for path in ours.glob("*.py")) == shipped

    history = ok(alembic("history"))
    assert f"{rl.head_revision()} -> {revision_id(first)}, orders" in history
    assert f"{revision_id(first)} -> {revision_id(second)} (head), later" in history
    assert "(runledger)" not in history
    ok(alembic("upgrade", "head"))
    assert "app_orders" in tables(engine)
    assert versions(engine, "alembic_version") == {revision_id(second)}


def test_option_2_upgrade_sql_writes_the_queue_ddl_and_the_script_builds_the_schema(
    option_2_host, installed_site, empty_database, engine
):
    script = ok(run("alembic", option_2_host, installed_site, empty_database, "upgrade", "head", "--sql"))

    assert "CREATE TABLE job_queue" in script and "CREATE TABLE app_orders" in script
    assert tables(engine) == set()  # offline: nothing ran
    raw = engine.raw_connection()
    try:
        raw.driver_connection.autocommit = True  # the script has its own BEGIN and COMMIT
        with raw.cursor() as cursor:
            cursor.execute(script)
    finally:
        raw.close()
    assert versions(engine, "alembic_version") == {HOST_HEAD}
    rl_engine = rl.create_engine(empty_database)
    try:
        rl.check_schema(rl_engine)  # runledger's tables match this version's, found through the app's table
    finally:
        rl_engine.dispose()


def test_option_1_upgrade_sql_fails_with_a_coded_error_and_changes_nothing(
    option_1_host, installed_site, empty_database, engine
):
    result = run("alembic", option_1_host, installed_site, empty_database, "upgrade", "head", "--sql")

    assert result.returncode != 0
    assert "db.offline_migration_unsupported: rl.migrate() runs online only" in result.stderr, result.stderr
    assert "runledger-sync migrate --sql" in result.stderr  # where the queue's part of the script comes from
    assert tables(engine) == set()


NEXT_RUNLEDGER_REVISION = '''"""A later runledger-sync's revision (a no-op here)."""
revision = "0099"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade():
    pass


def downgrade():
    pass
'''


def test_option_2_a_newer_runledger_revision_is_merged_into_the_hosts_history(
    option_2_host, installed_site, tmp_path, empty_database, engine
):
    site = tmp_path / "site"
    shutil.copytree(installed_site, site)
    (site / "runledger_sync" / "_alembic" / "versions" / "0099_next.py").write_text(
        NEXT_RUNLEDGER_REVISION, encoding="utf-8"
    )

    def alembic(*argv: str) -> subprocess.CompletedProcess:
        return run("alembic", option_2_host, site, empty_database, *argv)

    ok(run("alembic", option_2_host, installed_site, empty_database, "upgrade", "head"))
    assert len(ok(alembic("heads")).strip().splitlines()) == 2
    refused = alembic("upgrade", "head")
    assert refused.returncode != 0 and "Multiple head revisions" in refused.stdout + refused.stderr

    before = set((option_2_host / "versions").glob("*.py"))
    ok(alembic("merge", "heads", "-m", "runledger-sync next"))

    # The merge file lands in the app's directory, never in the installed package.
    merged = set((option_2_host / "versions").glob("*.py")) - before
    assert len(merged) == 1
    assert sorted(p.name for p in (site / "runledger_sync" / "_alembic" / "versions").glob("*.py")) == [
        "0001_queue_tables.py", "0002_job_schedules.py", "0003_hot_path_storage.py", "0004_workflows.py",
        "0005_flow_control.py", "0006_failure_evidence.py", "0007_retention.py", "0008_continuations.py",
        "0009_dashboard_rollup.py", "0010_job_meta.py", "0011_idempotency_key_prefix.py",
        "0012_workflow_append.py", "0013_unique_jobs.py", "0014_job_batches.py", "0015_job_operations.py",
        "0016_job_replays.py", "0017_batch_workflow_runs.py", "0099_next.py",
    ]
    ok(alembic("upgrade", "head"))
    assert versions(engine, "alembic_version") == {merged.pop().name.split("_", 1)[0]}


def test_option_2_migrate_refuses_to_move_tables_the_host_history_manages(
    option_2_host, installed_site, empty_database, engine
):
    ok(run("alembic", option_2_host, installed_site, empty_database, "upgrade", "head"))
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX idx_job_queue_claim")

    cli = run("runledger-sync", option_2_host, installed_site, empty_database, "--database-url", empty_database, "migrate")

    assert cli.returncode == 1
    error, hint = cli.stderr.splitlines()
    assert error.startswith("error: db.schema_managed_by_host: runledger's tables are managed by your application's")
    assert f"alembic_version holds {HOST_HEAD}" in error and "alembic upgrade head" in error
    assert hint.startswith("hint: ") and "alembic upgrade head" in hint and "CREATE" not in hint
    assert VERSION_TABLE not in tables(engine)
    rl_engine = rl.create_engine(empty_database)
    try:
        with pytest.raises(rl.errors.SchemaManagedByHost) as caught:
            rl.migrate(rl_engine)
        assert caught.value.code == "db.schema_managed_by_host"
        assert isinstance(caught.value, rl.MigrationFailed)
    finally:
        rl_engine.dispose()


def test_migrate_refuses_tables_that_no_version_table_records(empty_database, engine):
    rl_engine = rl.create_engine(empty_database)
    try:
        rl.migrate(rl_engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")

        with pytest.raises(rl.errors.SchemaManagedByHost) as caught:
            rl.migrate(rl_engine)

        assert "neither runledger_alembic_version nor alembic_version records" in caught.value.message
        assert "RUNLEDGER_ALEMBIC_VERSION_TABLE" in caught.value.message
        assert QUEUE_TABLES <= tables(engine) and VERSION_TABLE not in tables(engine)
    finally:
        rl_engine.dispose()


# -- option 2 in a clone (an editable install): the resource names the symlink --------------------------------

RESOURCE_LINE = "\n    runledger_sync:_alembic/versions\n"


def test_option_2_in_a_clone_the_resource_resolves_through_the_migrations_link(option_2_host, empty_database, engine):
    def alembic(*argv: str) -> subprocess.CompletedProcess:
        return run("alembic", option_2_host, REPO, empty_database, *argv)

    assert RESOURCE_LINE in (option_2_host / "alembic.ini").read_text(encoding="utf-8")
    clones_versions = REPO / "alembic" / "versions"
    shipped = sorted(path.name for path in clones_versions.glob("*.py"))

    heads = ok(alembic("heads")).strip().splitlines()
    assert len(heads) == 1 and heads[0].startswith(f"{HOST_HEAD} ")
    ok(alembic("upgrade", "head"))

    assert {"app_orders", "alembic_version"} | QUEUE_TABLES <= tables(engine)
    assert versions(engine, "alembic_version") == {HOST_HEAD}
    assert NO_CHANGES in ok(alembic("check"))
    before = set((option_2_host / "versions").glob("*.py"))
    ok(alembic("revision", "--autogenerate", "-m", "probe"))
    assert "op." not in upgrade_body(take_revision_file(option_2_host, before))
    # The clone's own history is untouched: new revisions land in the project's directory.
    assert sorted(path.name for path in clones_versions.glob("*.py")) == shipped

    ok(alembic("downgrade", "base"))
    assert not tables(engine) & ({"app_orders"} | QUEUE_TABLES)
