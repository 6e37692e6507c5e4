"""`python -m marin ...` is the `marin` command."""

from marin.cli import main

raise SystemExit(main())
