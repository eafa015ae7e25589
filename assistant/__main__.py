"""`python -m assistant` = the `assistant` command (for a machine where the project is on PYTHONPATH, not installed)."""
from assistant.cli import main

raise SystemExit(main())
