"""The rules of ``nccl-doctor check``: each a stable code, what it finds and the fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nccl_doctor import paths


@dataclass(frozen=True)
class Rule:
    code: str
    title: str
    fix: str


RULES: dict[str, Rule] = {r.code: r for r in (
    Rule("ND001", "a collective on one side of a rank-dependent condition",
         "Make the collective on every rank (before the condition, or in both arms), or keep "
         "it out of every rank alike: every rank must make the same collectives in the same "
         "order."),
    Rule("ND002", "a call of a function of yours that makes collectives, on one side of a "
                  "rank-dependent condition",
         "Call it on every rank, or move its collectives out of it and make them on every "
         "rank: the function makes collectives every rank must join."),
    Rule("ND004", "a library call that makes collectives on every rank (the catalog: "
                  "Accelerator.wait_for_everyone, Trainer.evaluate, DCP's save, "
                  "save_checkpoint, ...), on one side of a rank-dependent condition",
         "Call it on every rank: the library makes collectives inside it that every rank must "
         "join."),
    Rule("ND005", "generate under ZeRO-3 or FSDP without synced_gpus=True",
         "Pass synced_gpus=True to generate: with the parameters sharded, each decoding step is "
         "a collective, and a rank whose sequences end first would leave the others waiting."),
    Rule("ND006", "process groups created in a rank-dependent order",
         "Create every group on every rank in the same order (all of them, before the "
         "branch), then choose the one each rank uses: torch numbers the groups by the order "
         "they are created in, and each creation is a collective of the default group."),
    Rule("ND003", "a rank-dependent early exit (continue, break, return, raise) before a "
                  "collective, or a loop whose count depends on the rank around one",
         "Decide the exit (or the loop's count) on every rank alike, or make the collective "
         "before it: the ranks that leave, or loop fewer times, skip a collective the others "
         "wait in."),
)}


@dataclass(frozen=True)
class CheckFinding:
    """One finding: where the call is, the rule, and the condition that splits the ranks."""

    code: str
    path: str
    line: int
    col: int  # 1-based, as linters print it
    call: str  # the call as written: "dist.all_reduce", "save_checkpoint"
    condition: str  # the condition's line, stripped
    condition_line: int
    names: tuple[str, ...]  # the rank-dependent names it reads
    via: str = ""  # ND002: the collective the function makes, "path:line call"
    fix: str = ""  # ND004: the catalog entry's own fix
    arm: str = "if"  # where the call stands: "if" (under the condition), "else", "jump" (after
    # an exit it decides)
    how: str = ""  # how a name it reads depends on the rank, from another function (a caller's
    # argument, a helper's return, an attribute set elsewhere: source/rank_flow.py)

    @property
    def rule(self) -> Rule:
        return RULES[self.code]

    def message(self) -> str:
        via_path, _, via_rest = self.via.partition(":")
        via = f"{paths.short_path(via_path)}:{via_rest}" if self.via else ""
        if self.code == "ND006":
            return (f"process groups are created in a rank-dependent order under the "
                    f"condition at line {self.condition_line} (`{self.condition}`): "
                    f"{self.call}: the ranks pair different groups' creations and hang or "
                    "mix them up")
        if self.code == "ND005":
            shown = self.how if self.how.startswith("shown in") else (
                f"shown at line {self.condition_line}" + (f"; {self.how}" if self.how else ""))
            return (f"`{self.call}` under {self.condition} ({shown}) without "
                    "synced_gpus=True: a rank whose sequences end first leaves the others "
                    "waiting in the sharded forward's all-gather")
        what = {"ND004": f"`{self.call}` makes collectives ({self.via})",
                "ND001": f"`{self.call}` is a collective",
                "ND002": f"`{self.call}` makes collectives ({via})",
                "ND003": f"`{self.call}` is a collective"}[self.code]
        where = (f"in the loop whose count depends on the rank at line {self.condition_line}"
                 if self.arm == "for" else
                 f"after the rank-dependent exit at line {self.condition_line}"
                 if self.code == "ND003" else
                 f"under the rank-dependent condition at line {self.condition_line}")
        reads = f", reading {', '.join(self.names)}" if self.names else ""
        reads += f"; {self.how}" if self.how else ""
        return (f"{what} {where} (`{self.condition}`{reads}): some ranks skip it while the "
                "others wait in it")

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "path": self.path, "line": self.line, "column": self.col,
                "call": self.call, "message": self.message(), "rule": self.rule.title,
                "fix": self.fix or self.rule.fix,
                "condition": {"line": self.condition_line, "text": self.condition,
                              "names": list(self.names)},
                **({"via": self.via} if self.via else {}),
                **({"how": self.how} if self.how else {})}
