"""`python -m autotuner` is the same as the `autotuner` console script."""

from __future__ import annotations

from autotuner.cli.main import main

raise SystemExit(main())
