"""What an engine option accepts, and what an environment variable may be set to.

An SLA reaches the engine's command line (``engine.params``, ``engine.args``, ``search``) and
its environment (``engine.env``), and the engine runs as the tuner's (or the daemon's) user.
Both are therefore allow-lists: an option is settable only when the search space declares it
or the engine's adapter lists it, with an :class:`OptionRule` for its values; a variable only
when the adapter lists it, with an :class:`EnvRule`. Engine-neutral: the lists themselves live
with each engine (``search_spaces/<engine>.yaml`` and the adapter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from autotuner.core.show import show_value
from autotuner.core.types import same_value

OptionType = Literal["int", "float", "bool", "categorical"]

_INT_RE = re.compile(r"^-?\d{1,18}\Z")
_FLOAT_RE = re.compile(r"^-?(\d{1,18}(\.\d*)?|\.\d+)([eE][-+]?\d{1,3})?\Z")


@dataclass(frozen=True)
class OptionRule:
    """The values one engine option accepts.

    ``type`` as in the search space (a ``float`` also takes ints); ``low``/``high``: inclusive
    limits of a number (None: open); ``choices``: the only values a categorical takes (None:
    any text of the safe shape below). ``source`` says where the rule comes from, for messages.
    """

    type: OptionType
    low: int | float | None = None
    high: int | float | None = None
    choices: tuple[bool | int | float | str | None, ...] | None = None
    source: str = ""

    def describe(self) -> str:
        """``"an integer >= 1"``, ``"a number in [0.01, 1]"``, ``"one of auto, fp8"``."""
        if self.type == "bool":
            return "true or false"
        if self.type == "categorical":
            if self.choices is None:
                return "a word"
            # Quoted: a choice can be any word, and is read apart from the sentence around it.
            shown = (show_value(c, quote_text=True) for c in self.choices if c is not None)
            return "one of " + ", ".join(shown)
        what = "an integer" if self.type == "int" else "a number"
        if self.low is not None and self.high is not None:
            return f"{what} in [{show_value(self.low)}, {show_value(self.high)}]"
        if self.low is not None:
            return f"{what} >= {show_value(self.low)}"
        if self.high is not None:
            return f"{what} <= {show_value(self.high)}"
        return what

    def problem(self, value: object) -> str | None:
        """Why ``value`` is refused (None: accepted)."""
        if self.type == "bool":
            ok = isinstance(value, bool)
        elif self.type == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.type == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = ok and value == value and value not in (float("inf"), float("-inf"))
        elif self.choices is not None:
            ok = any(same_value(value, c) for c in self.choices)
        else:
            ok = isinstance(value, str) and _WORD_RE.match(value) is not None
        if ok and isinstance(value, int | float) and not isinstance(value, bool):
            ok = (self.low is None or value >= self.low) and (
                self.high is None or value <= self.high
            )
        got = show_value(value, quote_text=True)
        return None if ok else f"must be {self.describe()}, got {got}"

    def from_word(self, text: str) -> bool | int | float | str:
        """A command-line word as the value it stands for (``"8"`` -> 8 for an int option);
        words that are no number stay text, so :meth:`problem` refuses them."""
        if self.type == "int" and _INT_RE.match(text):
            return int(text)
        if self.type == "float" and _FLOAT_RE.match(text):
            return float(text)
        if self.type == "categorical" and self.choices is not None:
            for c in self.choices:
                if c is not None and str(c) == text:
                    return c
        return text


# Text values of open categoricals and of environment variables: no paths, no spaces, no
# shell or Python syntax; enough for names, numbers and CPU lists (0-31|32-63).
_WORD_RE = re.compile(r"^[A-Za-z0-9_.,:|+=-]{1,200}\Z")


@dataclass(frozen=True)
class EnvRule:
    """An environment variable an SLA may set: ``pattern`` is what its value must match in
    full, ``shape`` says it for people, ``why`` what it is for."""

    pattern: str
    shape: str
    why: str = ""

    def problem(self, value: str) -> str | None:
        if re.fullmatch(self.pattern, value) is None:
            return f"must be {self.shape}, got {value!r}"
        return None


FLAG = EnvRule(r"0|1|true|false|True|False", "0 or 1")
COUNT = EnvRule(r"\d{1,9}", "a whole number")
NUMBER = EnvRule(r"\d{1,9}(\.\d{1,9})?", "a number")
WORD = EnvRule(r"[A-Za-z0-9_.,:|+=-]{1,200}", "a word (letters, digits, _ . , : | + = -)")


def words(*choices: str) -> EnvRule:
    """A variable that takes one of ``choices``."""
    return EnvRule("|".join(re.escape(c) for c in choices), "one of " + ", ".join(choices))
