"""What each attention head does, measured as Clark et al. 2019 ("What Does BERT Look At?") do:
per head, the average share of a token's attention that goes to the previous token, the next
token, [CLS], [SEP], punctuation and itself, and the entropy of its attention distribution.

Shares are means over the query tokens of every sentence (each query's weights sum to 1; a
query with no previous token, the first, is left out of the "previous" mean, likewise the last
for "next"). Weights come as one (H, L, L) tensor per layer for one sentence.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["SENTENCES", "ROLES", "HeadRoles", "head_roles", "entropy", "encoder_attentions"]

# A small bundled set: the Winograd trophy sentence and others with coreference, clauses,
# punctuation and repeated words, so that positional, delimiter and punctuation heads show.
SENTENCES = (
    "The trophy didn't fit in the suitcase because it was too big.",
    "The trophy didn't fit in the suitcase because it was too small.",
    "The city councilmen refused the demonstrators a permit because they feared violence.",
    "The animal didn't cross the street because it was too tired.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "She poured water from the bottle into the cup until it was full.",
    "After the storm passed, the children ran outside to play in the puddles.",
    "The quick brown fox jumps over the lazy dog; the dog does not move.",
    "In 1969, Neil Armstrong became the first person to walk on the Moon.",
    "Attention is all you need, or so the paper claims.",
    "The lawyer asked the witness a question, but he was reluctant to repeat it.",
    "Bank rates rose sharply, so many people moved their savings to another bank.",
    "If you can't explain it simply, you don't understand it well enough.",
    "The book that my friend recommended was long, dense and surprisingly funny.",
    "Researchers trained the model for three days on eight GPUs before it converged.",
    "Why did the chicken cross the road? To get to the other side!",
    "The man couldn't lift his son because he was so weak.",
    "The man couldn't lift his son because he was so heavy.",
    "Joan made sure to thank Susan for all the help she had received.",
    "The delivery truck zoomed by the school bus because it was going so fast.",
    "Sam tried to paint a picture of shepherds with sheep, but they ended up looking more like golfers.",
    "The fish ate the worm; it was tasty.",
    "I poured water on the fire until it was out.",
    "The sculpture rolled off the shelf because it wasn't anchored.",
    "The river flooded the valley after three weeks of heavy rain.",
    "Please send the report by Friday, or call me if you need more time.",
    "Most birds can fly, but penguins, ostriches and kiwis cannot.",
    "He read the letter twice, folded it carefully, and put it back in the drawer.",
    "The committee, which met on Monday, postponed its decision until next month.",
    "A stitch in time saves nine.",
    "Water boils at 100 degrees Celsius at sea level.",
    "The museum was closed, so we walked along the canal instead.",
    "Neither the teacher nor the students knew where the keys had gone.",
    "Tokyo, the capital of Japan, is one of the largest cities in the world.",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "When the lights went out, everyone in the theater fell silent.",
    "Our flight was delayed because of fog at the airport.",
    "The violinist played the sonata from memory without a single mistake.",
    "Every morning she runs five kilometres before breakfast.",
    "The old bridge, built in 1887, was finally replaced last year.",
)

ROLES = ("previous", "next", "self", "cls", "sep", "punctuation")
_PUNCTUATION = set(string.punctuation) | {"…", "–", "—", "“", "”", "‘", "’"}


def entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row of ``weights`` (..., S), 0 log 0 = 0."""
    w = weights.double()
    return -(w * torch.where(w > 0, w.log(), torch.zeros_like(w))).sum(-1)


def _is_punctuation(token: str) -> bool:
    return bool(token) and all(ch in _PUNCTUATION for ch in token)


@dataclass(frozen=True)
class HeadRoles:
    """Per (layer, head) arrays of shape (layers, heads): one for each role in :data:`ROLES`, and
    ``entropy`` (nats), each averaged over all query tokens of all sentences; ``sentences``
    and ``tokens`` say what they were measured on."""

    shares: dict[str, np.ndarray]
    entropy: np.ndarray
    sentences: int
    tokens: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.entropy.shape

    def heads(self, role: str, *, above: float = 0.5) -> list[tuple[int, int, float]]:
        """(layer, head, share) of the heads whose mean share of ``role`` exceeds ``above``, largest first."""
        if role not in self.shares:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        share = self.shares[role]
        found = [(int(l), int(h), float(share[l, h])) for l, h in zip(*np.nonzero(share > above))]
        return sorted(found, key=lambda x: -x[2])

    def dominant(self) -> np.ndarray:
        """(layers, heads) array of each head's largest-share role name ("broad" below 0.5; "-" for a head its layer
        lacks)."""
        stacked = np.stack([self.shares[r] for r in ROLES])
        absent = np.isnan(stacked).all(0)  # a head its layer lacks (layers of several head counts: NaN)
        names = np.array(ROLES, dtype=object)[np.where(absent, 0, np.nan_to_num(stacked, nan=-1.0).argmax(0))]
        return np.where(absent, "-", np.where(np.nan_to_num(stacked, nan=-1.0).max(0) > 0.5, names, "broad"))

    def table(self) -> list[dict]:
        """One row per head: layer, head, each role's share, entropy and the dominant role."""
        dominant = self.dominant()
        layers, heads = self.shape
        return [{"layer": l, "head": h, **{r: float(self.shares[r][l, h]) for r in ROLES},
                 "entropy": float(self.entropy[l, h]), "role": str(dominant[l, h])}
                for l in range(layers) for h in range(heads)]


def head_roles(attentions: Sequence[Sequence[torch.Tensor]], tokens: Sequence[Sequence[str]], *,
               cls_token: str = "[CLS]", sep_token: str = "[SEP]") -> HeadRoles:
    """Head roles from per-sentence attentions: ``attentions[k][l]`` is sentence k's (H, L, L)
    weights in layer l, ``tokens[k]`` its L tokens (with the special tokens)."""
    if len(attentions) != len(tokens) or not tokens:
        raise ValueError(f"need as many attention lists as token lists (>= 1), got {len(attentions)} and {len(tokens)}")
    sums: dict[str, torch.Tensor] = {r: torch.zeros(()) for r in ROLES}
    counts = {r: 0 for r in ROLES}
    entropy_sum, n_tokens = torch.zeros(()), 0
    for layers, words in zip(attentions, tokens):
        w = torch.stack([torch.as_tensor(a).double() for a in layers])  # (layers, H, L, L)
        L = len(words)
        if w.shape[-2:] != (L, L):
            raise ValueError(f"attention of shape {tuple(w.shape)} does not fit {L} tokens")
        index = torch.arange(L)
        masks = {
            "cls": torch.tensor([t == cls_token for t in words]),
            "sep": torch.tensor([t == sep_token for t in words]),
            "punctuation": torch.tensor([_is_punctuation(t) for t in words]),
        }
        per_query = {
            "previous": w[..., index[1:], index[1:] - 1],  # (layers, H, L-1)
            "next": w[..., index[:-1], index[:-1] + 1],
            "self": w[..., index, index],
        } | {name: w[..., mask].sum(-1) for name, mask in masks.items()}
        for role, values in per_query.items():
            sums[role] = sums[role] + values.sum(-1)
            counts[role] += values.shape[-1]
        entropy_sum = entropy_sum + entropy(w).sum(-1)
        n_tokens += L
    shares = {r: (sums[r] / counts[r]).numpy() for r in ROLES}
    return HeadRoles(shares, (entropy_sum / n_tokens).numpy(), len(tokens), n_tokens)


@torch.no_grad()
def encoder_attentions(model, tokenizer, sentences: Sequence[str]) -> tuple[list[list[torch.Tensor]], list[list[str]]]:
    """Run a BERT-style :class:`~attnkit.models.EncoderModel` with a ``tokenizers`` tokenizer on each
    sentence alone (no padding): per sentence, the list of (H, L, L) weights per layer (float32, on
    the CPU whatever the model's device) and the tokens."""
    attentions, tokens = [], []
    model.eval()
    device = next(model.parameters()).device
    for sentence in sentences:
        encoding = tokenizer.encode(sentence)
        ids = torch.tensor([encoding.ids], device=device)
        out = model(ids, torch.ones_like(ids), torch.tensor([encoding.type_ids], device=device), need_weights=True)
        attentions.append([a[0].float().cpu() for a in out.attentions])
        tokens.append(list(encoding.tokens))
    return attentions, tokens
