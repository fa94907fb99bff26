"""``attnkit evaluate``: refusals of data and options the model cannot use."""

from __future__ import annotations

import pytest

from cli_helpers import assert_probe, fill, probe_ids, refused

PROBES = [
    # (argv with {placeholders}, words the message must contain)
    (["evaluate", "--checkpoint", "{run}", "--data", "{fake.gz}"], ["fake.gz", "not a gzip file"]),
    (["evaluate", "--checkpoint", "{run}", "--json", "{dir}"], ["--json", "folder"]),
    (["evaluate", "--checkpoint", "{run}", "--limit", "-5"], ["--limit"]),
    (["evaluate", "--checkpoint", "{run}", "--json", "/proc/attnkit-probe/s.json"], ["--json"]),
]


@pytest.mark.parametrize("argv, words", PROBES, ids=probe_ids(PROBES))
def test_bad_input_gives_exit_2_and_a_message_naming_it(world, argv, words, capsys):
    assert_probe(argv, world, words, capsys)


@pytest.mark.parametrize("argv, words", [
    (["evaluate", "--checkpoint", "{run}", "--data", "{pairs}", "--direction", "fr-en"], ["--direction"]),
    (["evaluate", "--checkpoint", "{run}", "--data", "grc-en"], ["--data grc-en", "unknown"]),
    (["evaluate", "--checkpoint", "{run}", "--data", "bible", "--direction", "fr-en"], ["--data bible", "unknown"]),
])
def test_an_option_that_would_do_nothing_is_refused(argv, words, run, phrase_file, tmp_path, capsys):
    files = {"pairs": phrase_file, "run": run, "tmp": tmp_path}
    refused(fill(argv, files), capsys, *words)
