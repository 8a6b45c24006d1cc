"""A model's chat template, rendered under bounds: it comes with the model, so it is as hostile
as any other input. Jinja's sandbox stops attribute tricks and caps one ``range()`` at 100000
items, but two nested ``range(99999)`` loops still run for hours, and ``'x' * 10**10`` eats the
memory. Each rendering here stops with :class:`TemplateRunaway` past :data:`SECONDS` or
:data:`MAX_CHARS` of text, and a repeated string or list is refused before it is built.

The time bound is a trace function on the template's own frames (code Jinja compiled from the
template, file name ``<template>``): it sees every line the template runs, loops included,
and is removed when the rendering ends. Frames of other code are not traced.
"""

from __future__ import annotations

import operator
import sys
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment

SECONDS = 5.0  # a real chat template renders a conversation in well under a millisecond
MAX_CHARS = 8_000_000  # a prompt past any context length (about 2M tokens)
_TEMPLATE_FILE = "<template>"


class TemplateRunaway(ValueError):
    """The chat template ran too long or wrote too much."""


class _Bounded(ImmutableSandboxedEnvironment):
    """The sandbox, with ``*`` and ``**`` checked before they build something huge."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "*":
            for seq, n in ((left, right), (right, left)):
                sized = isinstance(seq, str | list | tuple) and isinstance(n, int)
                if sized and len(seq) * n > MAX_CHARS:
                    raise TemplateRunaway(f"a repeat of {n} would pass {MAX_CHARS} items")
            return operator.mul(left, right)
        if isinstance(right, int) and abs(right) > 1000 and isinstance(left, int):
            raise TemplateRunaway(f"a power of {right} is refused")
        return super().call_binop(context, operator_, left, right)


def compile_template(source: str) -> Template:
    """The template, compiled in the bounded sandbox (Jinja's errors as they are)."""
    return _Bounded(trim_blocks=True, lstrip_blocks=True).from_string(source)


def render(template: Template, context: Mapping[str, Any]) -> str:
    """``template`` rendered with ``context``; :class:`TemplateRunaway` past the bounds."""
    deadline = time.monotonic() + SECONDS

    def in_template(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise TemplateRunaway(f"rendering ran past {SECONDS:g} s (a loop without end?)")
        return in_template

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != _TEMPLATE_FILE:
            return None  # not the template's code: no line events there
        return in_template(frame, event, arg)

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        out: list[str] = []
        size = 0
        for chunk in template.generate(**context):
            size += len(chunk)
            if size > MAX_CHARS:
                raise TemplateRunaway(f"rendering wrote more than {MAX_CHARS} characters")
            out.append(chunk)
        return "".join(out)
    finally:
        sys.settrace(previous)
