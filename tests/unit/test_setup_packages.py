"""setup.cfg lists every package of runledger_sync: one left out is missing from the wheel."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_listed_in_setup_cfg():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = {name.split("#")[0].strip() for name in config["options"]["packages"].splitlines()} - {""}
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "runledger_sync").rglob("__init__.py") if "_alembic" not in init.parts
    }
    assert on_disk - listed == set()
    assert {name for name in listed if not name.startswith("runledger_sync._alembic")} - on_disk == set()
