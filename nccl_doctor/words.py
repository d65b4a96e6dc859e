"""How the reports name ranks in a sentence: the list of ranks, and a verb that agrees with it.

``ranks_verb([0], "waits in all_reduce #3")`` is "rank 0 waits in all_reduce #3",
``ranks_verb([0, 1], ...)`` "ranks 0, 1 wait in all_reduce #3". Every sentence whose subject is
some ranks is formed here, so that none says "rank 0 wait" or "ranks 0, 1 was stopped".
"""

from __future__ import annotations

from typing import Iterable, Sequence

#: how a stopped rank's signal reads when the user sent it (``run`` forwarded it to the job)
BY_USER = " by the user"

__all__ = ["BY_USER", "conjugate", "pick", "ranges", "ranks_text", "ranks_verb", "runs", "verb"]

# third person singular -> plural, where dropping the s does not make it
_IRREGULAR = {"is": "are", "was": "were", "has": "have", "does": "do", "isn't": "aren't",
              "wasn't": "weren't", "hasn't": "haven't", "doesn't": "don't"}
# words ending in s that are no verb in the present tense (left as they are)
_NOT_PRESENT = frozenset({"its", "this", "thus", "as", "us", "plus", "less", "unless", "across"})


def runs(ranks: Iterable[int]) -> list[list[int]]:
    """The ranks, sorted, cut into runs of consecutive numbers: [0, 1, 2, 5] -> [[0, 1, 2], [5]]."""
    out: list[list[int]] = []
    for r in sorted(ranks):
        if out and r == out[-1][-1] + 1:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def ranges(ranks: Iterable[int], sep: str = ", ") -> str:
    """The ranks as ranges, every run of two or more folded: ``0-3, 5, 8-9`` (a label, a
    list in parentheses; ``ranks_text`` names ranks in a sentence)."""
    return sep.join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
                    for run in runs(set(ranks)))


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0, 2`` or, runs of three or more as ranges, ``ranks 0-636, 638-1023``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts = [f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run))
             for run in runs(ranks)]
    return "ranks " + ", ".join(parts)


def verb(ranks: Sequence[int] | int, singular: str) -> str:
    """``singular`` (a verb in the third person singular: "waits", "was", "has", "makes") as it
    agrees with ``ranks`` (the ranks, or how many): itself for one rank, its plural ("wait",
    "were", "have", "make") for several. A verb in the past tense ("exited") is the same in both."""
    if pick(ranks, "one", "many") == "one":
        return singular
    lower = singular.lower()
    if lower in _IRREGULAR:
        plural = _IRREGULAR[lower]
        return plural.capitalize() if singular[:1].isupper() else plural
    if lower in _NOT_PRESENT or not lower.endswith("s") or lower.endswith("ss") or len(lower) < 3:
        return singular
    if lower.endswith("ies") and len(lower) > 4 and lower[-4] not in "aeiou":
        return singular[:-3] + "y"  # carries -> carry
    if lower.endswith(("sses", "shes", "ches", "xes", "zes", "oes")):
        return singular[:-2]  # passes -> pass, reaches -> reach, does (irregular above)
    return singular[:-1]  # waits -> wait


def pick(ranks: Sequence[int] | int, one: str, many: str) -> str:
    """``one`` for one rank, ``many`` for several: the words that agree with ``ranks`` beyond
    the verb (``pick(ranks, "its", "their")``, ``pick(ranks, "it", "them")``)."""
    return one if (ranks if isinstance(ranks, int) else len(ranks)) == 1 else many


def conjugate(ranks: Sequence[int] | int, predicate: str) -> str:
    """``predicate`` (a verb phrase for one rank: "was stopped by nccl-doctor") with its first
    word made to agree with ``ranks`` ("were stopped by nccl-doctor" for several)."""
    first, space, rest = predicate.partition(" ")
    return verb(ranks, first) + space + rest


def ranks_verb(ranks: Sequence[int], predicate: str) -> str:
    """The sentence with ``ranks`` as its subject: ``ranks_verb([0, 1], "waits in all_reduce
    #3")`` -> "ranks 0, 1 wait in all_reduce #3"; ``predicate`` is said of one rank (its first
    word a verb in the third person singular, or in the past tense)."""
    return f"{ranks_text(ranks)} {conjugate(ranks, predicate)}"
