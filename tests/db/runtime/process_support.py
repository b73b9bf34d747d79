"""Start ``worker_process.py`` as a real child process and follow its log lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from sqlalchemy import text

from tests.handlers import SIDE_EFFECTS_DDL

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("worker_process.py")


class WorkerProcess:
    def __init__(self, url: str, mode: str | None, *, script: Path = SCRIPT) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.process = subprocess.Popen(
            [sys.executable, str(script), url, *([mode] if mode else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    def records(self) -> list[dict]:
        parsed = []
        for line in list(self.lines):
            try:
                parsed.append(json.loads(line))
            except ValueError:
                continue  # a traceback line, say
        return parsed

    def logged(self, message: str) -> bool:
        return any(record.get("message") == message for record in self.records())

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._reader.join(5)
        if self.process.stderr is not None:
            self.process.stderr.close()


def create_side_effects(engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(SIDE_EFFECTS_DDL))
