"""``attnkit build-ext``: where the compiled module is and whether it loads, a failed build as one line, refusals."""

from __future__ import annotations

from attnkit.cli import main
from attnkit.functional import compiled


def test_build_ext_status_and_a_failed_build_are_one_line(tmp_path, monkeypatch, capsys):
    """`attnkit build-ext --status` says where the library is and whether it loads; a failed build is a named
    error with exit status 2 (attention() keeps its Python path), and so is --verbose beside --status."""
    monkeypatch.setenv(compiled.DIRECTORY_VARIABLE, str(tmp_path))
    assert main(["build-ext", "--status"]) == 0
    assert capsys.readouterr().out.strip().endswith(("not built", "loaded"))

    def failing_build(verbose, progress):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(compiled, "build", failing_build)
    assert main(["build-ext"]) == 2
    assert "did not build (Ninja is required" in capsys.readouterr().err
    assert main(["build-ext", "--status", "--verbose"]) == 2  # (an option that would do nothing: named)
    assert "--verbose builds; --status says where the library is and builds nothing" in capsys.readouterr().err
