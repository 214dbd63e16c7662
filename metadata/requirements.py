"""What a compaction publish requires of the published state, stated up front.

A publish is one compare-and-swap of ``compaction.json`` from the version a run planned
from.  The swap itself only knows that the version moved; the requirements say what the
run actually depends on (the epoch it planned from, the topic generation it read), so a
publish that loses names the requirement that failed instead of leaving the caller to
work out why.  A swap that loses while every requirement still holds lost to a change
that does not touch the run's result (garbage collection trimming the retired list).
"""

from __future__ import annotations

from typing import Protocol

from shale.ledger.errors import ConflictError
from shale.ledger.values import dataclass
from shale.metadata.state import CompactionState

__all__ = ["AssertEpoch", "AssertTopicGeneration", "PublishRequirement", "RequirementFailedError", "unmet"]


class PublishRequirement(Protocol):
    """One condition on the published compaction state."""

    def violation(self, current: CompactionState) -> str | None:
        """Why ``current`` does not meet the requirement, or None when it does."""
        ...


@dataclass(frozen=True, slots=True)
class AssertEpoch:
    """The published epoch is still the one the run planned from: no other compactor
    published since."""

    epoch: int

    def violation(self, current: CompactionState) -> str | None:
        if current.epoch == self.epoch:
            return None
        return f"another compactor published epoch {current.epoch} first (this run planned from epoch {self.epoch})"


@dataclass(frozen=True, slots=True)
class AssertTopicGeneration:
    """The topic was not truncated after the run read its ledger list: the compaction
    state's topic generation is at most the one the run read."""

    generation: int

    def violation(self, current: CompactionState) -> str | None:
        if current.topic_generation <= self.generation:
            return None
        return (f"the topic was truncated while this run read it (retention; topic generation "
                f"{current.topic_generation}, this run read {self.generation})")


class RequirementFailedError(ConflictError):
    """A publish lost because a requirement no longer holds; ``requirement`` is the first
    one that failed."""

    def __init__(self, message: str, requirement: PublishRequirement) -> None:
        super().__init__(message)
        self.requirement = requirement


def unmet(requirements: tuple[PublishRequirement, ...], current: CompactionState,
          where: str) -> RequirementFailedError | None:
    """The error for the first requirement ``current`` does not meet, or None."""
    for requirement in requirements:
        why = requirement.violation(current)
        if why is not None:
            return RequirementFailedError(f"{where}: {why}", requirement)
    return None
