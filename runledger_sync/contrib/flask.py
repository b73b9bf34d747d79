"""Flask integration: an engine per app, enqueue helpers, an optional in-process worker, CLI commands.

Example::

    from flask import Flask
    from runledger_sync.contrib.flask import Runledger
    from myapp.jobs import registry

    app = Flask(__name__)
    app.config["RUNLEDGER_DATABASE_URL"] = "postgresql://app@localhost/app"
    runledger = Runledger(app, registry)

    @app.post("/signup")
    def signup():
        with runledger.engine.begin() as conn:
            conn.execute(users.insert().values(email=request.form["email"]))
            runledger.enqueue("email.welcome", {"email": request.form["email"]}, connection=conn)
        return "", 201

Configuration (read by :meth:`Runledger.init_app`, never at import):

- ``RUNLEDGER_DATABASE_URL``: the queue's database; falls back to
  ``SQLALCHEMY_DATABASE_URI``, then to the ``RUNLEDGER_DATABASE_URL`` /
  ``DATABASE_URL`` environment variables.
- ``RUNLEDGER_SCHEMA``: the schema holding the queue tables.
- ``RUNLEDGER_POOL_MODE``: ``"session"`` (default) or ``"transaction"`` behind
  PgBouncer in transaction pooling mode (no prepared statements, no LISTEN);
  falls back to the ``RUNLEDGER_POOL_MODE`` environment variable.
- ``RUNLEDGER_AUTOSTART_WORKER`` (default False): run a :class:`~runledger_sync.Supervisor`
  inside the web process.
- ``RUNLEDGER_DASHBOARD_READ_ONLY`` (default True), ``RUNLEDGER_DASHBOARD_AUTHORIZE``
  (``authorize(request, action)``, given the Flask request and run in the request
  context, returning False, True or the user's id; without one the dashboard serves
  nobody, and ``runledger_sync.web.allow_anyone`` lets everyone in) and
  ``RUNLEDGER_DASHBOARD_ORGANIZATION``: the dashboard's options when
  ``Runledger(app, dashboard="/jobs")`` mounts it (see :func:`runledger_sync.web.create_app`);
  its CSRF key is ``app.secret_key`` when set, and its forms are bound to the Flask session.
- ``RUNLEDGER_DASHBOARD_ALLOWED_HOSTS``: the host names the dashboard answers to besides
  the loopback names and the host of ``SERVER_NAME`` (a list; ``"*"`` for any); other
  hosts get 400 ``web.host_not_allowed``.
- ``RUNLEDGER_OBSERVER``: the observer the app's worker reports to, e.g. a
  :class:`runledger_sync.metrics.WorkerMetrics` whose counters you serve; it wins over
  ``Runledger(observer=...)``, which applies to every app of the extension.
- ``RUNLEDGER_<FIELD>`` for any :class:`~runledger_sync.JobsConfig` field
  (``RUNLEDGER_POLL_INTERVAL_MS``, ``RUNLEDGER_MAX_GLOBAL_CONCURRENCY``...),
  applied over :meth:`JobsConfig.from_env`.

Handlers run inside ``app.app_context()``, so they can use ``current_app`` and
app-bound extensions. The commands ``flask runledger migrate`` and ``flask
runledger worker`` are added to the app's CLI.

This module imports only the public ``runledger_sync`` API.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import click
from flask import Flask, current_app, has_app_context
from flask.cli import AppGroup

import runledger_sync as rl
from runledger_sync.contrib.flask_dashboard import as_bool, mount_dashboard
from runledger_sync.logging import LOG_FORMATS

EXTENSION_KEY = "runledger"
CONFIG_PREFIX = "RUNLEDGER_"
#: app.config keys this extension reads besides the JobsConfig fields.
DATABASE_URL_KEY = "RUNLEDGER_DATABASE_URL"
FALLBACK_DATABASE_URL_KEY = "SQLALCHEMY_DATABASE_URI"
SCHEMA_KEY = "RUNLEDGER_SCHEMA"
POOL_MODE_KEY = "RUNLEDGER_POOL_MODE"
AUTOSTART_KEY = "RUNLEDGER_AUTOSTART_WORKER"
OBSERVER_KEY = "RUNLEDGER_OBSERVER"
DEFAULT_AUTOSTART_WORKER = False
#: Set to "true" by Werkzeug's reloader in the child process that serves requests.
RELOADER_CHILD_VARIABLE = "WERKZEUG_RUN_MAIN"


@dataclass
class _AppState:
    """What init_app() built for one app."""

    engine: Any
    config: rl.JobsConfig
    registry: rl.JobRegistry
    autostart: bool
    observer: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    supervisor: rl.Supervisor | None = None
    supervisor_pid: int | None = None


class Runledger:
    """The Flask extension: one queue engine, registry and optional worker per app.

    Args:
        app: The app to set up now; or call :meth:`init_app` later (app factories).
        registry: The handlers the in-process worker and ``flask runledger worker``
            run. Without one, the app can enqueue but not run jobs.
        dashboard: A URL path (``"/jobs"``) at which to mount the operator dashboard,
            or None for no dashboard. It serves nobody until
            ``RUNLEDGER_DASHBOARD_AUTHORIZE`` names a hook.
        observer: What the in-process worker and ``flask runledger worker`` report
            to (``Supervisor(observer=...)``), e.g. a
            :class:`runledger_sync.metrics.WorkerMetrics`; an app's ``RUNLEDGER_OBSERVER`` wins.

    Example:
        ``runledger = Runledger(); runledger.init_app(app)``
    """

    def __init__(
        self, app: Flask | None = None, registry: rl.JobRegistry | None = None, *, dashboard: str | None = None,
        observer: Any = None,
    ) -> None:
        self.app = app
        self.registry = registry if registry is not None else rl.JobRegistry()
        self.dashboard = dashboard
        self.observer = observer
        self._states: weakref.WeakKeyDictionary[Flask, _AppState] = weakref.WeakKeyDictionary()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read ``app.config``, build the app's engine and register the CLI commands.

        Raises:
            ConfigError: no database URL was configured or found, or it is not PostgreSQL;
                or the pool mode is neither ``"session"`` nor ``"transaction"``.
        """
        url = app.config.get(DATABASE_URL_KEY) or app.config.get(FALLBACK_DATABASE_URL_KEY) or None
        schema = app.config.get(SCHEMA_KEY) or None
        state = _AppState(
            engine=rl.create_engine(url, schema=schema, pool_mode=app.config.get(POOL_MODE_KEY) or None),
            config=config_from_app(app.config),
            registry=in_app_context(self.registry, app),
            autostart=as_bool(app.config.get(AUTOSTART_KEY, DEFAULT_AUTOSTART_WORKER)),
            observer=self.observer if app.config.get(OBSERVER_KEY) is None else app.config[OBSERVER_KEY],
        )
        self._states[app] = state
        app.extensions[EXTENSION_KEY] = self
        app.cli.add_command(_command_group())
        if self.dashboard is not None:
            mount_dashboard(app, self.dashboard, state.engine)
        if state.autostart:
            if os.environ.get(RELOADER_CHILD_VARIABLE) == "true":
                self.start_worker(app)
            else:
                # Outside the reloader child we cannot tell a plain server from the
                # reloader's parent, which only watches files; the parent never serves
                # a request, so starting on the first one runs exactly one worker.
                app.before_request(lambda: self._start_once(app))

    # -- per-app state ---------------------------------------------------------------

    def _state(self, app: Flask | None = None) -> _AppState:
        if app is None:
            app = current_app._get_current_object() if has_app_context() else self.app  # type: ignore[attr-defined]
        if app is None or app not in self._states:
            raise RuntimeError("Runledger is not set up for this app; call init_app(app) first")
        return self._states[app]

    @property
    def engine(self) -> Any:
        """The queue's Engine for the current app (or the app given to the constructor)."""
        return self._state().engine

    @property
    def config(self) -> rl.JobsConfig:
        """The JobsConfig the worker of the current app runs with."""
        return self._state().config

    @property
    def supervisor(self) -> rl.Supervisor | None:
        """The in-process Supervisor of the current app, or None when none was started."""
        return self._state().supervisor

    # -- enqueueing -----------------------------------------------------------------

    def enqueue(self, job_type: str, payload: Any = None, *, connection: Any = None, **options: Any) -> rl.JobRecord:
        """Enqueue a job on the app's database (see :func:`runledger_sync.enqueue`).

        Args:
            job_type: A type with a job definition (``flask runledger migrate``
                writes the registry's definitions).
            payload: Any JSON value.
            connection: A Connection or ORM Session (Flask-SQLAlchemy's ``db.session``)
                whose transaction the job joins: it exists only if that transaction
                commits. Without one, the job is committed at once.
                The queue schema (``RUNLEDGER_SCHEMA``) is not applied to a connection
                you pass; address it through the search path or ``rl.with_schema``.
            **options: ``priority``, ``delay_seconds``, ``idempotency_key``... as for
                :func:`runledger_sync.enqueue`.

        Returns:
            The job's record.
        """
        state = self._state()
        bind = connection if connection is not None else state.engine
        options.setdefault("max_payload_bytes", state.config.max_payload_bytes)
        options.setdefault("event_log", state.config.event_log)
        return rl.enqueue(bind, job_type, payload, **options)

    def enqueue_many(self, specs: Any, *, connection: Any = None) -> list[rl.JobRecord]:
        """Enqueue several :class:`~runledger_sync.JobSpec` at once, like :meth:`enqueue`."""
        state = self._state()
        bind = connection if connection is not None else state.engine
        return rl.enqueue_many(bind, specs, max_payload_bytes=state.config.max_payload_bytes,
                               event_log=state.config.event_log)

    def sync_definitions(self, app: Flask | None = None) -> Any:
        """Write the registry's job definitions, so its types can be enqueued."""
        state = self._state(app)
        return state.registry.sync_definitions(state.engine)

    # -- the in-process worker ---------------------------------------------------------

    def start_worker(self, app: Flask | None = None) -> rl.Supervisor:
        """Start the app's in-process Supervisor unless this process already runs one.

        It is stopped when the interpreter exits, or by :meth:`stop_worker`. A
        process forked after the start (a pre-forking server) gets its own, since
        threads do not survive a fork.

        Returns:
            The running Supervisor.
        """
        state = self._state(app)
        with state.lock:
            if state.supervisor is not None and state.supervisor_pid == os.getpid():
                return state.supervisor
            state.registry.sync_definitions(state.engine)
            supervisor = rl.Supervisor(state.engine, state.registry, state.config, observer=state.observer)
            supervisor.start()
            state.supervisor, state.supervisor_pid = supervisor, os.getpid()
        atexit.register(_stop_at_exit, weakref.ref(supervisor))
        return supervisor

    def _start_once(self, app: Flask) -> None:
        state = self._state(app)
        # Checked without the lock first: after the first request this is one read.
        if state.supervisor is None or state.supervisor_pid != os.getpid():
            self.start_worker(app)

    def stop_worker(self, app: Flask | None = None, timeout: float = 30.0) -> bool:
        """Stop the app's in-process Supervisor, letting running jobs drain for ``timeout`` seconds.

        Returns:
            True if it stopped in time (or none was running).
        """
        state = self._state(app)
        with state.lock:
            supervisor, state.supervisor, state.supervisor_pid = state.supervisor, None, None
        return supervisor.stop(timeout) if supervisor is not None else True

    def run_worker(self, app: Flask | None = None, *, drain_timeout: float = 30.0) -> int:
        """Run the app's worker in the foreground until SIGINT/SIGTERM (``flask runledger worker``).

        Returns:
            The process exit status of :meth:`Supervisor.run_until_shutdown`.
        """
        state = self._state(app)
        state.registry.sync_definitions(state.engine)
        supervisor = rl.Supervisor(state.engine, state.registry, state.config, observer=state.observer)
        return supervisor.run_until_shutdown(drain_timeout)


def _stop_at_exit(supervisor_ref: weakref.ref[rl.Supervisor]) -> None:
    supervisor = supervisor_ref()
    if supervisor is not None:
        supervisor.stop()


# -- translating app.config ----------------------------------------------------------------


def config_from_app(app_config: Any) -> rl.JobsConfig:
    """Return :meth:`JobsConfig.from_env` with each ``RUNLEDGER_<FIELD>`` key of ``app_config`` applied.

    A string value is parsed (and clamped) as the environment variable of that
    name would be; any other value is used as given and checked when the worker
    starts.
    """
    config = rl.JobsConfig.from_env()
    overrides: dict[str, Any] = {}
    for config_field in dataclasses.fields(rl.JobsConfig):
        key = CONFIG_PREFIX + config_field.name.upper()
        if key not in app_config:
            continue
        value = app_config[key]
        if isinstance(value, str) and config_field.name != "worker_id":
            value = getattr(rl.JobsConfig.from_env({key: value}), config_field.name)
        overrides[config_field.name] = value
    return config.with_overrides(**overrides)


# -- handlers in the app context -------------------------------------------------------------


def in_app_context(registry: rl.JobRegistry, app: Flask) -> rl.JobRegistry:
    """Return a new registry whose handlers run ``registry``'s inside ``app.app_context()``.

    The types, retry rules and definitions are the same; ``registry`` is unchanged.
    """
    return registry.wrapped(app.app_context)


# -- the CLI ------------------------------------------------------------------------------


def _extension() -> Runledger:
    extension = current_app.extensions.get(EXTENSION_KEY)
    if extension is None:
        raise click.UsageError("Runledger is not set up for this app; call Runledger(app) or init_app(app)")
    return extension


def _command_group() -> AppGroup:
    group = AppGroup("runledger", help="Runledger job queue commands.")

    @group.command("migrate")
    def migrate_command() -> None:
        """Upgrade the queue schema to the newest revision and write the job definitions."""
        extension = _extension()
        engine = extension.engine
        before = rl.current_revision(engine)
        rl.migrate(engine)
        after = rl.current_revision(engine)
        definitions = extension.sync_definitions(current_app._get_current_object())  # type: ignore[attr-defined]
        moved = "already up to date" if before == after else f"migrated from {before or 'an empty database'}"
        click.echo(f"schema at {after} ({moved}); {len(definitions)} job definition(s) written")

    @group.command("worker")
    @click.option("--drain-timeout", type=float, default=30.0, show_default=True,
                  help="seconds running jobs get to finish after SIGINT/SIGTERM")
    @click.option("--log-format", type=click.Choice(LOG_FORMATS), default=None,
                  help="text (one line per finished job) or json; default $RUNLEDGER_LOG_FORMAT, "
                       "else text on a terminal and json otherwise (the app's own logging, if set up, wins)")
    def worker_command(drain_timeout: float, log_format: Optional[str]) -> None:
        """Run this app's job handlers until SIGINT or SIGTERM."""
        try:
            rl.configure_logging_unless_configured(log_format=log_format)
        except rl.ConfigError as refused:
            raise click.UsageError(str(refused)) from None  # exit 2, as the console script's worker
        status = _extension().run_worker(
            current_app._get_current_object(), drain_timeout=drain_timeout  # type: ignore[attr-defined]
        )
        if status:
            raise SystemExit(status)

    return group
