"""``python -m attnkit.cli``: the ``attnkit`` command."""

from . import main

raise SystemExit(main())
