"""Where attnkit's and transformers' greedy tokens part in half precision (`benchmarks/hybrid_decode.py` prints
"same tokens False" for some hybrids in bfloat16), and whether rounding explains it.

For each family, both sides decode greedily in ``--dtype`` from the same weights and prompt, as
`hybrid_decode.py` does. At the first step where their tokens differ, the common prefix (the prompt and the tokens
both chose) runs once more through attnkit's model in float64 (the oracle: the float64 tests hold it to
transformers' float64 numbers to 1e-10) and through each side's half-precision model (a full forward, no cache).
Then, at that step:
- ``margin``: float64's logit of the token one side chose minus that of the token the other chose (how close the
  choice was);
- ``ours_error`` and ``theirs_error``: the largest |half-precision logit - float64 logit| over the vocabulary, for
  each side.

Where the margin is within both sides' errors, either choice is as right as the precision allows: rounding, not a
difference of arithmetic. The float64 oracle's own choice is printed too.

    python benchmarks/hybrid_parting.py --dtype bfloat16 --out benchmarks/results/hybrid_parting.json
"""
import argparse
import copy
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from hybrid_decode import FAMILIES, decode_ours, decode_theirs, models  # noqa: E402

from attnkit._files import write_json  # noqa: E402
from attnkit.bench import machine_info  # noqa: E402


def _last_logits(model, tokens: torch.Tensor, theirs: bool) -> torch.Tensor:
    out = model(tokens, use_cache=False) if theirs else model(tokens)
    return out.logits[0, -1].double()


def parting(family: str, dtype: torch.dtype, prompt: torch.Tensor) -> dict:
    ours64, theirs = models(family, "cpu", torch.float64)  # one build: the half-precision models are its casts
    ours, theirs = copy.deepcopy(ours64).to(dtype), theirs.to(dtype)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, ours_tokens = decode_ours(ours, prompt, "cpu")
        _, their_tokens = decode_theirs(theirs, prompt, "cpu")
        differ = (ours_tokens != their_tokens)[0].nonzero()
        if not len(differ):
            return {"family": family, "parted": False}
        step = int(differ[0])
        # the first generated token comes from the prompt's forward; step i's token from the prefix before it
        first = ours(prompt, last_only=True).logits[:, -1:].argmax(-1)
        prefix = torch.cat([prompt, first, ours_tokens[:, :step]], 1)
        exact = _last_logits(ours64, prefix, theirs=False)
        ours_logits = _last_logits(ours, prefix, theirs=False)
        their_logits = _last_logits(theirs, prefix, theirs=True)
    a, b = int(ours_tokens[0, step]), int(their_tokens[0, step])
    return {"family": family, "parted": True, "step": step, "ours_token": a, "theirs_token": b,
            "float64_token": int(exact.argmax()), "margin": float(exact[a] - exact[b]),
            "ours_error": float((ours_logits - exact).abs().max()),
            "theirs_error": float((their_logits - exact).abs().max()),
            "logit_scale": float(exact.abs().max())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    prompt = torch.randint(3, 512, (1, 32), generator=torch.Generator().manual_seed(0))  # hybrid_decode.py's prompt
    rows = []
    for family in args.families:
        row = parting(family, dtype, prompt)
        rows.append(row)
        if not row["parted"]:
            print(f"{family:12s} the same {args.dtype} tokens", flush=True)
            continue
        within = abs(row["margin"]) <= min(row["ours_error"], row["theirs_error"])
        print(f"{family:12s} parted at step {row['step']:2d}: attnkit {row['ours_token']}, transformers "
              f"{row['theirs_token']}, float64 {row['float64_token']}; float64 margin {row['margin']:+.4f}, "
              f"{args.dtype} logit errors {row['ours_error']:.4f} (attnkit) {row['theirs_error']:.4f} "
              f"(transformers), logits up to {row['logit_scale']:.2f}: "
              f"{'within both errors' if within else 'NOT within both errors'}", flush=True)
    write_json(Path(args.out), {"machine": machine_info("cpu"), "dtype": args.dtype, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
