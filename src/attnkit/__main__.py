"""``python -m attnkit``: the same as the ``attnkit`` command."""

from .cli import main

raise SystemExit(main())
