"""The one error of the package: a space file or an override that can't be used."""

from __future__ import annotations

from collections.abc import Sequence

from autotuner.core.errors import BadInput


class SpaceError(BadInput, ValueError):
    """A search-space file or an override that can't be used; one problem per line."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))
