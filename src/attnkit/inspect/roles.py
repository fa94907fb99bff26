"""What each attention head does, measured as Clark et al. 2019 ("What Does BERT Look At?") do:
per head, the average share of a token's attention that goes to the previous token, the next
token, [CLS], [SEP], punctuation and itself, and the entropy of its attention distribution.

Shares are means over the query tokens of every sentence (each query's weights sum to 1; a
query with no previous token, the first, is left out of the "previous" mean, likewise the last
for "next"). Weights come as one (H, L, L) tensor per layer for one sentence.

Shares and entropy are defined for weights that are probabilities. A linear or state-space layer's implicit
attention (Mamba-2's SSD, the delta rule: :func:`attnkit.functional.linear.implicit_attention`) is not: its
entries may be negative and its rows need not sum to one. Such heads (:func:`implicit_heads`) get no share and
no entropy (NaN) and the role "implicit"; :func:`magnitude_shares` is the named normalisation the viewer shows
for them.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["SENTENCES", "ROLES", "HeadRoles", "head_roles", "entropy", "encoder_attentions", "implicit_heads",
           "magnitude_shares", "DISTRIBUTION_TOLERANCE"]

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


DISTRIBUTION_TOLERANCE = 1e-3
"""A head's rows are a distribution where no entry is below -this and every row with a weight sums to 1 within
it (float32 softmax rows sum to 1 within 1e-6; a state-space head's sums ranged from -0.46 to 0.85)."""


def implicit_heads(attentions: Sequence[Sequence[torch.Tensor]]) -> np.ndarray:
    """(layers, H) True where a head's rows are not probability distributions in some sentence (a negative entry,
    or a row whose sum is not 1): a linear or state-space layer's implicit attention. ``attentions[k][l]`` is
    sentence k's (H, L, S) weights in layer l; a head a layer lacks (NaN) is not implicit."""
    found = None
    for layers in attentions:
        w = torch.stack([torch.as_tensor(a).double() for a in layers])  # (layers, H, L, S)
        sums = w.sum(-1)
        weighted = w.abs().sum(-1) > 0  # a row with no key (a padded or empty one) says nothing
        off = ((w < -DISTRIBUTION_TOLERANCE).any(-1) | (weighted & ((sums - 1).abs() > DISTRIBUTION_TOLERANCE)))
        head = (off & ~torch.isnan(sums)).any(-1)  # (layers, H)
        found = head if found is None else found | head
    return np.zeros((0, 0), dtype=bool) if found is None else found.numpy()


def magnitude_shares(weights: torch.Tensor) -> torch.Tensor:
    """Each row of ``weights`` (..., S) as the shares of its absolute entries, |a_ij| / sum_j |a_ij| (a row of
    zeros stays zeros): how an implicit-attention row splits its magnitude among the keys, the normalisation the
    inspection viewer shows for a head that is not a distribution."""
    magnitude = weights.abs()
    return magnitude / magnitude.sum(-1, keepdim=True).clamp_min(torch.finfo(magnitude.dtype).tiny)


def _is_punctuation(token: str) -> bool:
    return bool(token) and all(ch in _PUNCTUATION for ch in token)


@dataclass(frozen=True)
class HeadRoles:
    """Per (layer, head) arrays of shape (layers, heads): one for each role in :data:`ROLES`, and
    ``entropy`` (nats), each averaged over all query tokens of all sentences; ``sentences``
    and ``tokens`` say what they were measured on. ``implicit``: the heads whose rows are not distributions
    (:func:`implicit_heads`), whose shares and entropy are NaN."""

    shares: dict[str, np.ndarray]
    entropy: np.ndarray
    sentences: int
    tokens: int
    implicit: np.ndarray | None = None

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
        """(layers, heads) array of each head's largest-share role name ("broad" below 0.5; "implicit" for a head
        that is not a distribution; "-" for a head its layer lacks)."""
        stacked = np.stack([self.shares[r] for r in ROLES])
        absent = np.isnan(stacked).all(0)  # a head its layer lacks (layers of several head counts: NaN)
        names = np.array(ROLES, dtype=object)[np.where(absent, 0, np.nan_to_num(stacked, nan=-1.0).argmax(0))]
        named = np.where(absent, "-", np.where(np.nan_to_num(stacked, nan=-1.0).max(0) > 0.5, names, "broad"))
        return named if self.implicit is None else np.where(self.implicit, "implicit", named)

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
    implicit = implicit_heads(attentions)
    shares = {r: np.where(implicit, np.nan, (sums[r] / counts[r]).numpy()) for r in ROLES}
    return HeadRoles(shares, np.where(implicit, np.nan, (entropy_sum / n_tokens).numpy()), len(tokens), n_tokens,
                     implicit)


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
