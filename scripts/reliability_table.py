#!/usr/bin/env python3
"""Regenerate docs/reliability.md's fault-matrix table from the cells' artefacts (docs/reliability/cells/).

The work is tests/chaos/table.py (beside the cells that write the artefacts); this is its command:
`.venv/bin/python scripts/reliability_table.py [--check] [--cells DIR] [--doc PATH]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from chaos.table import main  # noqa: E402 - after the path above

if __name__ == "__main__":
    sys.exit(main())
