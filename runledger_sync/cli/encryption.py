"""``encryption rotate``: re-encrypt stored values under the current key, beside live traffic."""

from __future__ import annotations

import argparse

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, command, command_group, open_engine
from runledger_sync.cli._output import print_json

command_group("encryption", help="re-encrypt stored payloads, checkpoints and outputs under the current key")


def _rotate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=1000, metavar="N",
                        help="most rows per batch, each its own short transaction (default 1000)")
    parser.add_argument("--json", action="store_true", help="print the count as one JSON object")


@command("encryption rotate", help="seal clear rows and rows under old keys under RUNLEDGER_ENCRYPTION_CURRENT, "
                                   "in short batches that skip rows being written", arguments=_rotate_arguments)
def _rotate(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        rewritten = rl.rotate_encryption(engine, batch_size=args.batch_size)
    if args.json:
        print_json({"rewritten": rewritten})
    else:
        print(f"rewritten: {rewritten} rows now under the current key")
    return EXIT_OK
