"""`python -m fanfs`: the same as the `fanfs` console script."""

from __future__ import annotations

import sys

from fanfs.cli import main

sys.exit(main())
