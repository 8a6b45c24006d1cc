"""Load YAML while remembering where every key came from.

``load_located(text)`` returns the plain Python data (as ``yaml.safe_load`` would) together with
a map from key path to 1-based line number, and the duplicate keys found on the way. PyYAML
silently keeps the last of two equal keys, so duplicates are detected here while walking the
composed node tree, before construction.

Paths are tuples: mapping keys appear as ``str(key)``, sequence items as ``int`` indices. The
line of a mapping entry is the line of its key; the line of a sequence item is where the item
starts. Syntax errors are raised as ``yaml.YAMLError`` (``MarkedYAMLError`` carries the line).

Input is hostile until proven otherwise: before anything is composed, one flat pass over the
parser's events refuses documents nested deeper than ``MAX_DEPTH`` (PyYAML's composer recurses,
so deep nesting would end in a RecursionError) and documents whose aliases expand to more than
``MAX_NODES`` nodes (a few hundred bytes of nested anchors can expand to billions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    ScalarEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

PathPart = str | int
KeyPath = tuple[PathPart, ...]

_MERGE_TAG = "tag:yaml.org,2002:merge"

# An SLA is a few dozen keys deep at most a handful of levels; these leave room for big
# search-space lists while keeping every walk bounded.
MAX_DEPTH = 64
MAX_NODES = 100_000


class YamlTooLarge(yaml.MarkedYAMLError):
    """The document nests too deeply or its aliases expand beyond the node budget."""


@dataclass(frozen=True)
class Duplicate:
    """A mapping key that appears twice; ``line`` is the later occurrence."""

    path: KeyPath
    line: int
    first_line: int


@dataclass(frozen=True)
class Located:
    """YAML data plus the line of every key path (see the module docstring)."""

    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)
    duplicates: list[Duplicate] = field(default_factory=list)
    # Line where the document's top-level node starts (None for an empty document).
    root_line: int | None = None

    def line_of(self, path: KeyPath) -> int | None:
        """Line of the deepest prefix of ``path`` that exists in the file, or None."""
        for n in range(len(path), 0, -1):
            line = self.lines.get(path[:n])
            if line is not None:
                return line
        return None


def load_located(text: str) -> Located:
    """Parse one YAML document; raise ``yaml.YAMLError`` on malformed input."""
    check_bounds(text)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Located(data=None)
        lines: dict[KeyPath, int] = {}
        duplicates: list[Duplicate] = []
        # Walk before constructing: construction flattens merge keys in place, which would
        # make merged keys look like duplicates.
        _walk(node, (), lines, duplicates, _KeyReader())
        data = loader.construct_document(node)
        return Located(data, lines, duplicates, node.start_mark.line + 1)
    finally:
        loader.dispose()


def check_bounds(text: str, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Raise :class:`YamlTooLarge` if ``text`` nests or expands beyond the limits.

    Iterative over parser events (no recursion, no composition): each alias counts as the
    size of the node its anchor names, so the total is the size of the fully expanded data.
    """
    sizes: dict[str, int] = {}  # anchor -> expanded node count
    stack: list[tuple[str | None, int]] = []  # open collections: (anchor, nodes so far)
    total = 0
    loader = yaml.SafeLoader(text)
    try:
        while (event := loader.get_event()) is not None:  # type: ignore[no-untyped-call]
            if isinstance(event, CollectionStartEvent):
                if len(stack) >= max_depth:
                    raise _too_large(f"nested deeper than {max_depth} levels", event.start_mark)
                stack.append((event.anchor, 1))
                continue
            if isinstance(event, CollectionEndEvent):
                anchor, size = stack.pop()
            elif isinstance(event, ScalarEvent):
                anchor, size = event.anchor, 1
            elif isinstance(event, AliasEvent):
                # An unknown alias is left for the composer to report with its own message.
                anchor, size = None, sizes.get(event.anchor or "", 1)
            else:
                continue
            if anchor is not None:
                sizes[anchor] = size
            if stack:
                parent_anchor, parent_size = stack[-1]
                stack[-1] = (parent_anchor, parent_size + size)
            else:
                total += size
            if total + sum(s for _, s in stack) > max_nodes:
                raise _too_large(f"aliases expand to more than {max_nodes} nodes", event.start_mark)
    finally:
        loader.dispose()


def _too_large(problem: str, mark: Any) -> YamlTooLarge:
    return YamlTooLarge(problem=f"document too large: {problem}", problem_mark=mark)


class _KeyReader:
    """Turns scalar key nodes into the values the real constructor will produce."""

    def __init__(self) -> None:
        self._constructor = SafeConstructor()

    def key(self, node: Node) -> str:
        if isinstance(node, ScalarNode):
            try:
                return str(self._constructor.construct_object(node, deep=True))
            except yaml.YAMLError:
                return str(node.value)
        # Complex keys are rejected later by the constructor (unhashable); any label will do.
        return f"<{node.tag}>"


def _walk(
    node: Node,
    path: KeyPath,
    lines: dict[KeyPath, int],
    duplicates: list[Duplicate],
    keys: _KeyReader,
    *,
    merged: bool = False,
) -> None:
    if isinstance(node, MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                for src in _merge_sources(value_node):
                    _walk(src, path, lines, duplicates, keys, merged=True)
                continue
            key = keys.key(key_node)
            line = key_node.start_mark.line + 1
            child = (*path, key)
            if key in seen:
                duplicates.append(Duplicate(child, line, seen[key]))
            seen[key] = line
            # Keys pulled in by a merge (<<) never override explicit ones.
            if not (merged and child in lines):
                lines[child] = line
            _walk(value_node, child, lines, duplicates, keys, merged=merged)
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            child = (*path, i)
            if not (merged and child in lines):
                lines[child] = item.start_mark.line + 1
            _walk(item, child, lines, duplicates, keys, merged=merged)


def _merge_sources(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [node]
    if isinstance(node, SequenceNode):
        return [n for n in node.value if isinstance(n, MappingNode)]
    return []
