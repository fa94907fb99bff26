"""The ``attnkit`` console script's entry point, a module apart from the package: importing
``attnkit`` (and torch with it) takes seconds, and a Ctrl-C then would end in a traceback from the
import machinery. Here it ends with "interrupted" and exit status 130, like a Ctrl-C later on. An
environment switch attnkit refuses at import (``ATTNKIT_NAN_RULE=yes``) is one line and exit status 2.
``attnkit --version`` reads the installed version without importing attnkit."""

import sys


def main() -> int:
    if sys.argv[1:] == ["--version"]:  # answered without importing torch (seconds)
        version = _installed_version()
        if version is not None:
            print(f"attnkit {version}")
            return 0
    try:
        from attnkit.cli import main as run
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ValueError as error:  # attnkit.errors.InputError: a switch in the environment it refuses
        if type(error).__name__ != "InputError":
            raise
        print(f"attnkit: {error}", file=sys.stderr)
        return 2
    return run()


def _installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("attnkit")
    except metadata.PackageNotFoundError:  # run from a source tree: the package says it
        return None


if __name__ == "__main__":
    raise SystemExit(main())
