"""`python -m mloc` is the `mloc` command."""

from mloc.cli import main

raise SystemExit(main())
