"""Registration refuses, when the registering module is imported, each handler the worker could not run."""

from __future__ import annotations

import functools
import importlib
import textwrap
import uuid

import pytest

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.errors import AsyncHandler, DuplicateJobType, HandlerSignature, InvalidPayloadModel

HEADER = "import runledger_sync as rl\nregistry = rl.JobRegistry()\n"


def import_source(tmp_path, monkeypatch, body: str):
    """Import a fresh module made of HEADER and ``body``, as an application's jobs module is imported."""
    name = f"jobs_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(HEADER + textwrap.dedent(body), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


@pytest.mark.parametrize(("body", "error", "code"), [
    ("""
     @registry.job("mail.send")
     async def send(ctx, payload):
         pass
     """, AsyncHandler, "registry.async_handler"),
    ("""
     @registry.job
     async def send(ctx, payload):
         yield
     """, AsyncHandler, "registry.async_handler"),
    ("""
     class Send:
         async def __call__(self, ctx, payload):
             pass
     registry.job("mail.send")(Send())
     """, AsyncHandler, "registry.async_handler"),
    ("""
     class Send(rl.JobHandler):
         job_type = "mail.send"
         async def execute(self, ctx, payload):
             pass
     registry.register(Send())
     """, AsyncHandler, "registry.async_handler"),
    ("""
     @registry.job("mail.send")
     def send(payload):
         pass
     """, HandlerSignature, "registry.handler_signature"),
    ("""
     @registry.job("mail.send")
     def send(ctx, payload, *, to):
         pass
     """, HandlerSignature, "registry.handler_signature"),
    ("""
     class Send(rl.JobHandler):
         job_type = "mail.send"
         def execute(self, ctx):
             pass
     registry.register(Send())
     """, HandlerSignature, "registry.handler_signature"),
    ("""
     @registry.job("mail.send")
     def send(ctx, payload):
         pass
     @registry.job("mail.send")
     def send_again(ctx, payload):
         pass
     """, DuplicateJobType, "registry.duplicate_job_type"),
    ("""
     import dataclasses
     @dataclasses.dataclass
     class Mail:
         to: str
     @registry.job("mail.send", payload_model=Mail)
     def send(ctx, mail):
         pass
     """, InvalidPayloadModel, "registry.invalid_payload_model"),
])
def test_a_mistake_is_refused_at_import_with_its_code(tmp_path, monkeypatch, body, error, code):
    with pytest.raises(error) as raised:
        import_source(tmp_path, monkeypatch, body)
    assert raised.value.code == code
    assert isinstance(raised.value, rl.RegistrationError)
    assert "job type 'mail.send'" in raised.value.message or "job type 'send'" in raised.value.message


def test_the_decorator_works_with_and_without_parentheses(tmp_path, monkeypatch):
    module = import_source(tmp_path, monkeypatch, """
        @registry.job
        def send_email(ctx, payload):
            return None

        @registry.job()
        def build_report(ctx, payload):
            return None

        @registry.job("mail.digest", max_attempts=2)
        def digest(ctx, payload, *extra):
            return None
        """)
    assert module.registry.registered_types() == ["build_report", "mail.digest", "send_email"]
    # The function is returned unchanged, so it can still be called directly.
    assert module.send_email(None, {}) is None and callable(module.build_report)


def test_callables_that_take_ctx_and_payload_are_accepted():
    registry = rl.JobRegistry()

    def send(ctx, payload, retries=3):
        return None

    registry.job("a.partial")(functools.partial(send, retries=1))
    registry.job("a.builtin")(print)  # no signature to read: taken at its word
    registry.job("a.object")(type("Call", (), {"__call__": lambda self, ctx, payload: None})())
    assert len(registry) == 3


def test_a_refused_handler_leaves_no_trace():
    registry = rl.JobRegistry()
    with pytest.raises(HandlerSignature):
        registry.job("mail.send")(lambda ctx: None)
    assert len(registry) == 0 and "mail.send" not in registry


def test_the_command_line_names_the_mistake_and_how_to_fix_it(tmp_path, monkeypatch, capsys):
    (tmp_path / "async_jobs.py").write_text(HEADER + textwrap.dedent("""
        @registry.job("mail.send")
        async def send(ctx, payload):
            pass
        """), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["--database-url", "postgresql://nobody@127.0.0.1:1/none", "worker", "--app", "async_jobs:registry"])
    lines = capsys.readouterr().err.splitlines()
    assert code == 1
    assert lines[0].startswith("error: registry.async_handler: handler for job type 'mail.send' is an async function")
    assert lines[1] == "hint: write the handler as a plain def; run async code inside it with asyncio.run(...)"
