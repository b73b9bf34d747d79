"""``python -m runledger_sync.cli``: the same as the ``runledger-sync`` console script."""

import sys

from runledger_sync.cli import main

sys.exit(main())
