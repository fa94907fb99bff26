"""``attnkit generate`` on the native hybrids (Qwen3-Next, Qwen3.5, Kimi Linear, MiniMax-01, Mamba-2, Bamba, Granite
4.0-H, Nemotron-H, Falcon-H1): a checkpoint folder
with its tokenizer, the command's printed completion equal to transformers' greedy continuation of the same prompt,
decoded by the same tokenizer."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from attnkit.cli import main  # noqa: E402

from hybrid_checks import tiny_config  # noqa: E402

VOCAB = 64


def _saved_folder(family: str, folder, *, moved: float = 0.0):
    """transformers' tiny ``family`` model (its parameters moved by ``moved`` times a normal draw, the decay rates
    kept), saved to ``folder`` with a word-level tokenizer.json of the vocabulary: (the model, the tokenizer)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.AutoModelForCausalLM.from_config(tiny_config(family, vocab_size=VOCAB),
                                                            attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "A_log" not in name:
                p.add_(moved * torch.randn_like(p))
    theirs.save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w3"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.decoder = tokenizers.decoders.WordPiece()  # joins the words with spaces
    tokenizer.save(str(folder / "tokenizer.json"))
    return theirs, tokenizer



@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_text", "kimi_linear", "minimax", "mamba2", "bamba",
                                    "granitemoehybrid", "nemotron_h", "falcon_h1"])
def test_attnkit_generate_continues_a_hybrid_checkpoint_as_transformers_does(family, tmp_path, capsys):
    theirs, tokenizer = _saved_folder(family, tmp_path, moved=0.3)
    prompt = "w5 w17 w9 w33 w12 w40"
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    with torch.no_grad():
        want = theirs.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:]
    want = [t for t in want.tolist() if t != 2]  # transformers stops at (and keeps) the end token, attnkit prints neither
    assert main(["generate", "--model", str(tmp_path), "--prompt", prompt, "--max-new-tokens", "8"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == tokenizer.decode(want), (family, printed)


def test_compile_on_a_hybrid_is_refused_in_one_line(tmp_path, capsys):
    """A hybrid has no fixed-size caches (its linear layers carry a state replaced each step): --compile is refused
    by name with exit status 2, and generate(compile_step=...) with a ValueError, not a TypeError from inside."""
    from attnkit.decoding import generate
    from attnkit.models.pretrained import load_hf_folder

    _saved_folder("qwen3_next", tmp_path)
    capsys.readouterr()  # (transformers' save progress)
    assert main(["generate", "--model", str(tmp_path), "--prompt", "w5 w6", "--compile"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--compile: Qwen3NextLM has no fixed-size caches" in err
    with pytest.raises(ValueError, match="compile_step: Qwen3NextLM has no fixed-size caches"):
        generate(load_hf_folder(tmp_path), torch.tensor([[5, 6]]), compile_step="aot_eager")


def test_two_prompts_on_a_linear_first_hybrid_are_generated_as_a_padded_batch(tmp_path, capsys):
    """`attnkit generate --prompt A B` pads the prompts on the left into one batch: on a hybrid whose layer 0 is
    linear (Qwen3-Next's default layout) each completion is the one its prompt gives alone."""
    _saved_folder("qwen3_next", tmp_path)
    prompts = ["w5 w17 w9 w33 w12 w40", "w7 w8"]
    alone = []
    for prompt in prompts:
        assert main(["generate", "--model", str(tmp_path), "--prompt", prompt, "--max-new-tokens", "5"]) == 0
        alone.append(capsys.readouterr().out.strip())
    assert main(["generate", "--model", str(tmp_path), "--prompt", *prompts, "--max-new-tokens", "5"]) == 0
    together = capsys.readouterr().out
    for completion in alone:
        assert completion in together
