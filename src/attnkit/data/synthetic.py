"""Generated translation tasks whose word alignments are known, for fast tests and demos.

``number_phrases``: English noun phrases such as "three red cats and twelve dogs" rendered in
French as "trois chats rouges et douze chiens". Numbers are spelled out by ``num2words``; French
puts colour adjectives after the noun, so the alignment is not monotone.
"""

from __future__ import annotations

import random

from .corpus import Pair

__all__ = ["number_phrases"]

_NOUNS = {"cats": "chats", "dogs": "chiens", "birds": "oiseaux", "books": "livres", "trees": "arbres",
          "horses": "chevaux", "ships": "navires", "stones": "cailloux"}
_ADJECTIVES = {"red": "rouges", "black": "noirs", "green": "verts", "white": "blancs", "blue": "bleus",
               "yellow": "jaunes", "grey": "gris"}
_NUMBERS = range(2, 17)  # single words in both languages ("dix-sept" would split on the hyphen)


def _phrase(rng: random.Random, numbers: dict[int, tuple[str, str]]) -> tuple[list[str], list[str], list[int]]:
    """One phrase: English words, French words, and for each French word its English word's index."""
    english_number, french_number = numbers[rng.choice(_NUMBERS)]
    noun = rng.choice(sorted(_NOUNS))
    if rng.random() < 0.6:
        adjective = rng.choice(sorted(_ADJECTIVES))
        return ([english_number, adjective, noun], [french_number, _NOUNS[noun], _ADJECTIVES[adjective]], [0, 2, 1])
    return [english_number, noun], [french_number, _NOUNS[noun]], [0, 1]


def number_phrases(count: int, *, seed: int = 0, max_phrases: int = 3) -> list[Pair]:
    """``count`` English-French pairs of 1 to ``max_phrases`` phrases joined by "and" / "et".

    Each pair carries its gold ``alignment``: (source word index, target word index) links, one
    per target word.
    """
    from num2words import num2words

    numbers = {n: (num2words(n, lang="en"), num2words(n, lang="fr")) for n in _NUMBERS}
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        source: list[str] = []
        target: list[str] = []
        links: list[tuple[int, int]] = []
        for index in range(rng.randint(1, max_phrases)):
            if index:
                links.append((len(source), len(target)))
                source.append("and")
                target.append("et")
            english, french, order = _phrase(rng, numbers)
            links += [(len(source) + s, len(target) + t) for t, s in enumerate(order)]
            source += english
            target += french
        pairs.append(Pair(" ".join(source), " ".join(target), alignment=tuple(links)))
    return pairs
