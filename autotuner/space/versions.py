"""Engine versions and version specifiers, with a small comparator (no dependency on
``packaging``): the first ``X.Y[.Z...]`` in the text counts and pre/dev/local parts are
ignored, so ``0.12.0rc1`` and ``vllm 0.12.0+cu128`` are both 0.12.0 (flags are frozen once a
release candidate is cut). Specifiers are comma-separated clauses: ``>= <= > < == != ~=``,
``==X.Y.*``.
"""

from __future__ import annotations

import re

_VERSION_RE = re.compile(r"\d+(?:\.\d+)+")
_CLAUSE_RE = re.compile(r"^(>=|<=|==|!=|~=|>|<)?\s*(\d+(?:\.\d+)*)(\.\*)?\Z")


def parse_version(text: str) -> tuple[int, ...]:
    """``"vllm 0.12.0rc1 (cpu)"`` -> ``(0, 12)``: release numbers, trailing zeros stripped."""
    m = _VERSION_RE.search(text)
    if m is None:
        raise ValueError(f"no version number (like 0.32.0) in {text!r}")
    parts = [int(p) for p in m[0].split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _version_number(text: str) -> str:
    """The version number as written in ``text`` (``"vllm 0.32.0 (cpu)"`` -> ``"0.32.0"``)."""
    m = _VERSION_RE.search(text)
    return m[0] if m else text


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    pa, pb = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (pa > pb) - (pa < pb)


def _clause_holds(version: tuple[int, ...], clause: str) -> bool:
    m = _CLAUSE_RE.match(clause.strip())
    if m is None:
        raise ValueError(f"bad version clause {clause!r} (like '>=0.10' or '==0.11.*')")
    op, num, star = m[1] or "==", m[2], m[3]
    bound = tuple(int(p) for p in num.split("."))
    if star:
        if op not in ("==", "!="):
            raise ValueError(f"'.*' only goes with == or != in {clause!r}")
        prefix = version[: len(bound)] + (0,) * (len(bound) - len(version))
        return (prefix == bound) == (op == "==")
    c = _cmp(version, bound)
    if op == "~=":  # compatible release: >= bound, same prefix but the last part
        if len(bound) < 2:
            raise ValueError(f"'~=' needs at least two parts in {clause!r}")
        head = bound[:-1]
        return c >= 0 and (version + (0,) * len(head))[: len(head)] == head
    return {
        ">=": c >= 0,
        "<=": c <= 0,
        ">": c > 0,
        "<": c < 0,
        "==": c == 0,
        "!=": c != 0,
    }[op]


def version_in(version: str | tuple[int, ...], spec: str) -> bool:
    """Whether ``version`` satisfies every clause of ``spec`` (``">=0.10,<0.27"``; "" = any)."""
    v = parse_version(version) if isinstance(version, str) else version
    return all(_clause_holds(v, c) for c in spec.split(",") if c.strip())


def _check_spec(spec: str) -> str | None:
    try:
        version_in((0,), spec)
    except ValueError as e:
        return str(e)
    return None
