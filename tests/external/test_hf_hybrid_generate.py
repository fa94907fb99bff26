"""``attnkit generate`` on the native hybrids (Qwen3-Next, Qwen3.5, Kimi Linear, MiniMax-01): a checkpoint folder
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


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_text", "kimi_linear", "minimax"])
def test_attnkit_generate_continues_a_hybrid_checkpoint_as_transformers_does(family, tmp_path, capsys):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.AutoModelForCausalLM.from_config(tiny_config(family, vocab_size=VOCAB),
                                                            attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "A_log" not in name:
                p.add_(0.3 * torch.randn_like(p))
    theirs.save_pretrained(tmp_path)
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w3"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.decoder = tokenizers.decoders.WordPiece()  # joins the words with spaces
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    prompt = "w5 w17 w9 w33 w12 w40"
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    with torch.no_grad():
        want = theirs.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:]
    want = [t for t in want.tolist() if t != 2]  # transformers stops at (and keeps) the end token, attnkit prints neither
    assert main(["generate", "--model", str(tmp_path), "--prompt", prompt, "--max-new-tokens", "8"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == tokenizer.decode(want), (family, printed)
