"""``attnkit cost``: patterns, checkpoint configs, refusals."""

from __future__ import annotations

import pytest

from attnkit.cli import main

from cli_helpers import assert_probe, fill, probe_ids, refused


def test_cost_cli_with_a_pattern(capsys):
    from attnkit.cli import main

    assert main(["cost", "--model", "smollm2-135m", "--seq", "131072", "--pattern", "longformer",
                 "--pattern-options", "width=512", "num_global=16"]) == 0
    out = capsys.readouterr().out
    assert "pattern longformer: 71,359,984 of 17,179,869,184 pairs" in out and "BlockMask 1.0 MiB" in out
    assert "boolean tensor the mask takes 16.0 GiB" in out
    assert main(["cost", "--model", "smollm2-135m", "--pattern-options", "window=3"]) == 2
    assert main(["cost", "--model", "smollm2-135m", "--pattern", "window", "--pattern-options", "globals=3"]) == 2


def test_cost_of_a_translation_checkpoint_config(run, capsys):
    refused(["cost", "--model", run / "last" / "config.json"], capsys, "--model", "RNN translation model")


PROBES = [
    # (argv with {placeholders}, words the message must contain)
    (["cost", "--model", "{list.json}"], ["--model", "JSON object"]),
    (["cost", "--model", "{partial.json}"], ["required key"]),
    (["cost", "--model", "{stringy.json}"], ["n_embd", "'wide'"]),  # the config's own key
    (["cost", "--model", "gpt2-small", "--seq", "99999999999999"], ["--seq"]),
    (["cost", "--model", "gpt2-small", "--seq", "nan"], ["--seq"]),
]


@pytest.mark.parametrize("argv, words", PROBES, ids=probe_ids(PROBES))
def test_bad_input_gives_exit_2_and_a_message_naming_it(world, argv, words, capsys):
    assert_probe(argv, world, words, capsys)


@pytest.mark.parametrize("argv, words", [
    (["cost", "--model", "gpt2-small", "--pattern", "bigbird", "--pattern-options", "block=0"], ["block", ">= 1"]),
    (["cost", "--model", "gpt2-small", "--pattern", "dilated", "--pattern-options", "dilation=0"], ["dilation"]),
])
def test_an_option_that_would_do_nothing_is_refused(argv, words, run, phrase_file, tmp_path, capsys):
    files = {"pairs": phrase_file, "run": run, "tmp": tmp_path}
    refused(fill(argv, files), capsys, *words)


def test_cost_cli(capsys, tmp_path):
    assert main(["cost", "--model", "gpt2-small", "--seq", "4096", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 124,439,808" in out and "16,777,216 entries per head per layer" in out
    assert main(["cost", "--model", "nope", "--seq", "10"]) == 2
    assert "--model must be a preset" in capsys.readouterr().err


def test_an_attnkit_config_names_its_mistakes_and_never_counts_a_default_model(tmp_path, capsys):
    """An unknown field gave a traceback; a partial file was GPT-2 small's model silently."""
    import json

    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"kind": "decoder", "vocab_size": 100, "d_model": 64, "num_layers": 2, "num_heads": 4,
                                "d_ff": 128, "nmu_kv_heads": 2}))
    refused(["cost", "--model", typo], capsys, "--model", "unknown DecoderConfig fields ['nmu_kv_heads']")
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"kind": "decoder", "num_layers": 2}))
    refused(["cost", "--model", partial], capsys, "must give its sizes", "missing vocab_size, d_model, num_heads, d_ff")
    sized = tmp_path / "sized.json"
    sized.write_text(json.dumps({"kind": "decoder", "vocab_size": 100, "d_model": 64, "num_layers": 2, "num_heads": 4,
                                 "d_ff": 128}))
    assert main(["cost", "--model", str(sized), "--seq", "64"]) == 0
    out = capsys.readouterr().out
    assert "parameters: " in out and "note: fields the file does not give take attnkit's defaults: " in out
    assert "max_len" in out.split("defaults: ")[1]


def test_options_must_be_spelt_out(capsys):
    """argparse took --se as --seq (abbreviations); every command now refuses it, in one line."""
    refused(["cost", "--model", "gpt2-small", "--se", "128"], capsys, "unrecognized arguments: --se 128")


def test_cost_scales_its_units_to_the_number(capsys):
    """No "0.000 T" and no "67,108,864.0 MiB": each figure in the unit that fits it."""
    from attnkit.cost import bytes_text, flops_text

    assert [bytes_text(n) for n in (512, 3 * 2**10, 4 * 2**30, 2**50 * 3)] == ["512 B", "3.0 KiB", "4.0 GiB", "3.0 PiB"]
    assert [flops_text(n) for n in (12, 524288, 1.406e14)] == ["12 FLOP", "524.3 KFLOP", "140.6 TFLOP"]
    assert main(["cost", "--model", "llama3-8b", "--seq", "1", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "attention 524.3 KFLOP" in out and "0.000" not in out and "64 B per layer" in out


@pytest.mark.parametrize("suffix", ["svg", "png"])
def test_plot_replaces_only_attnkits_own_file_unless_overwrite(suffix, tmp_path, capsys):
    """A user's file under the --plot name (notes named figure.svg) is refused by name, exit 2, untouched; attnkit's
    own earlier plot is replaced; --overwrite replaces the user's."""
    notes = tmp_path / f"figure.{suffix}"
    notes.write_text("my notes")
    argv = ["cost", "--model", "qwen3-next-80b-a3b", "--seq", "4096", "--plot", str(notes)]
    assert main(argv) == 2
    assert "--plot" in capsys.readouterr().err and notes.read_text() == "my notes"
    assert main([*argv, "--overwrite"]) == 0
    assert notes.read_bytes() != b"my notes"
    assert main(argv) == 0  # attnkit's own plot: replaced without --overwrite
    assert main(["cost", "--model", "gpt2-small", "--overwrite"]) == 2  # (an option that would do nothing)


def test_a_transformers_hybrid_config_is_counted_and_unknown_presets_name_the_hybrids(tmp_path, capsys):
    """A Qwen3-Next config.json (its published sizes) gives the qwen3-next-80b-a3b preset's figures; an unknown
    preset's error lists the hybrid presets too."""
    import json

    transformers = pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(transformers.Qwen3NextConfig().to_dict()))
    assert main(["cost", "--model", str(path), "--seq", "65536"]) == 0
    from_file = capsys.readouterr().out.splitlines()[1:-1]  # (the first line names the model, the last the source)
    assert main(["cost", "--model", "qwen3-next-80b-a3b", "--seq", "65536"]) == 0
    assert from_file == capsys.readouterr().out.splitlines()[1:-1]
    assert main(["cost", "--model", "no-such-model"]) == 2
    assert "qwen3-next-80b-a3b" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["mamba2", "falcon_h1"])
def test_a_mamba2_or_falcon_h1_config_and_a_model_folder_are_counted(tmp_path, capsys, family):
    """The Mamba-2 families attnkit loads are counted too, from a config.json or the model folder holding it (as
    generate and inspect take one): Mamba-2 has nothing that grows with the context; Falcon-H1 holds attention and
    Mamba-2 in every layer, so its all-softmax model has as many softmax layers as it has."""
    import json

    transformers = pytest.importorskip("transformers")
    from attnkit.cost import hybrid_memory, shape_from_hf

    config = {"mamba2": transformers.Mamba2Config, "falcon_h1": transformers.FalconH1Config}[family]().to_dict()
    (tmp_path / "config.json").write_text(json.dumps(config))
    for model in (tmp_path / "config.json", tmp_path):
        assert main(["cost", "--model", str(model), "--seq", "4096"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert "constant state per sequence" in out
        if family == "mamba2":
            assert "KV cache of the softmax layers: 0 bytes per token" in out and "the same at any length" in out
    shape = shape_from_hf(config)
    memory = hybrid_memory(shape, 100, 2)
    if family == "falcon_h1":
        assert shape.parallel and shape.full_layers == shape.linear_layers == config["num_hidden_layers"]
        assert memory.all_softmax_bytes_per_token == memory.kv_bytes_per_token  # every layer already holds its KV
    else:
        assert memory.all_softmax_bytes_per_token == 0 and memory.total_bytes == memory.state_bytes


def test_a_config_with_no_heads_is_refused_by_its_key(tmp_path, capsys):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "vocab_size": 10, "hidden_size": 64, "num_hidden_layers": 2,
                                "num_attention_heads": 0, "intermediate_size": 10}))
    refused(["cost", "--model", path], capsys, "num_attention_heads must be an integer >= 1, got 0")
