"""The one YAML loader for the files gpufeed is handed: ``--config.file``, ``--web.config.file`` and scenarios.

PyYAML's ``safe_load`` constructs no objects, but it is not bounded: a deeply nested document overflows the
Python stack (``RecursionError``), an integer literal of more than 4300 digits is a bare ``ValueError``
(CPython's int-string conversion limit, CVE-2020-10735), an alias bomb expands to billions of nodes in the
code that walks the result, and nothing stops a 1 GB file from being read whole. Every loader going through
this module gets, before anything is built:

- the file read with a size cap (``MAX_BYTES``), refused unless it is a regular file (a FIFO in its place
  would block the reader forever), decoded as UTF-8 with a message giving the byte offset;
- nesting deeper than ``MAX_DEPTH`` refused while composing (long before the stack is at risk);
- aliases allowed (YAML users rely on anchors) but never recursive, and the document's size with every alias
  expanded capped at ``MAX_NODES``;
- integers beyond ``MAX_INT`` (2**64) and float literals that overflow to infinity refused; ``.inf`` and
  ``.nan`` written as such stay (the key's own validation decides whether they make sense);
- duplicate keys refused (a second ``tls_server_config`` silently replacing the first is how a review misses
  a change), and YAML 1.2 floats: ``1e9`` and ``6e9`` are numbers, as Go's YAML (node_exporter) and JSON
  read them; YAML 1.1, PyYAML's default, reads them as strings.

Every refusal is a :class:`YamlError` whose message names the key path (``rate_limit.burst``) and the line;
the three loaders prefix the file and turn it into their own error (exit 2 at start, "keep the previous
config" at reload).
"""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_BYTES = 1 << 20  # 1 MiB: the largest scenario in the project is 12 KB, a web config with a CA bundle ~200 KB
MAX_DEPTH = 64  # the deepest real document (a scenario) nests 7 levels
MAX_NODES = 1_000_000  # scalars + collections with every alias expanded
MAX_INT = 2**64  # the widest counter or id any key takes (a scenario seed is a u64)
MAX_LITERAL = 100  # characters of one numeric literal; 2**64 in binary is 67

INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"
MERGE_TAG = "tag:yaml.org,2002:merge"
_EXPLICIT_INF = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")


class YamlError(ValueError):
    """A document refused by a bound or a syntax error; ``path`` is the key path (empty: the document)."""

    def __init__(self, path: str, reason: str, line: int | None = None) -> None:
        self.path = path
        self.reason = reason
        self.line = line
        where = f" (line {line})" if line is not None else ""
        shown = path if len(path) <= 80 else f"{path[:40]}...{path[-30:]}"  # a 64-level path is unreadable whole
        super().__init__(f"{shown}: {reason}{where}" if path else f"{reason}{where}")


def _join(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


# libyaml's C parser when PyYAML was built with it (the wheels are): events ~20x faster than the pure-Python
# scanner, which needs ~20 s for a 1 MiB document on a busy core. Composition (where the bounds live) is ours.
_EVENTS: Any = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader


class _Resolver(yaml.resolver.Resolver):
    """PyYAML's implicit tags (YAML 1.1 booleans, ints) plus YAML 1.2 floats."""


# YAML 1.2 (and JSON) floats: an exponent without a dot (1e9, 6E-3) is a float, not the string YAML 1.1 makes it.
_Resolver.add_implicit_resolver(
    FLOAT_TAG,
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


class _Constructor(yaml.constructor.SafeConstructor):
    """SafeLoader's constructors: plain Python values only."""


class _Composer:
    """Events -> a node graph, like PyYAML's Composer, with the nesting bound, no recursive alias and key paths."""

    def __init__(self, text: str) -> None:
        self.events: Any = _EVENTS(text)
        self.resolve: Any = _Resolver().resolve
        self.anchors: dict[str, Node] = {}
        self.open_anchors: set[str] = set()

    def close(self) -> None:
        self.events.dispose()

    def single(self) -> Node | None:
        ev = self.events
        ev.get_event()  # StreamStart
        node: Node | None = None
        if not ev.check_event(yaml.StreamEndEvent):
            ev.get_event()  # DocumentStart
            node = self.node("", 1)
            ev.get_event()  # DocumentEnd
            if not ev.check_event(yaml.StreamEndEvent):
                mark = ev.peek_event().start_mark
                raise YamlError("", "more than one document (a second '---')", int(mark.line) + 1)
        ev.get_event()  # StreamEnd
        return node

    def node(self, path: str, depth: int) -> Node:
        ev = self.events
        event: Any = ev.get_event()
        start: Any = event.start_mark  # libyaml's marks or PyYAML's: same fields
        line = int(start.line) + 1
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.open_anchors:
                raise YamlError(path, f"alias *{event.anchor} refers to a node that contains it (recursive "
                                "document)", line)
            if event.anchor not in self.anchors:
                raise YamlError(path, f"alias *{event.anchor} names no anchor defined before it", line)
            return self.anchors[event.anchor]
        if depth > MAX_DEPTH:
            raise YamlError(path, f"nested deeper than {MAX_DEPTH} levels", line)
        anchor = event.anchor
        if anchor is not None and anchor in self.anchors:
            raise YamlError(path, f"anchor &{anchor} defined twice", line)
        tag = event.tag
        if isinstance(event, yaml.ScalarEvent):
            if tag is None or tag == "!":
                tag = self.resolve(ScalarNode, event.value, event.implicit)
            end: Any = event.end_mark
            node: Node = ScalarNode(tag, event.value, start, end, style=event.style)
            if anchor is not None:
                self.anchors[anchor] = node
            return node
        if anchor is not None:
            self.open_anchors.add(anchor)
        if isinstance(event, yaml.SequenceStartEvent):
            if tag is None or tag == "!":
                tag = self.resolve(SequenceNode, None, event.implicit)
            seq = SequenceNode(tag, [], start, None, flow_style=event.flow_style)
            if anchor is not None:
                self.anchors[anchor] = seq
            while not ev.check_event(yaml.SequenceEndEvent):
                seq.value.append(self.node(_join(path, len(seq.value)), depth + 1))
            seq.end_mark = ev.get_event().end_mark
            node = seq
        else:  # MappingStartEvent: the parser emits nothing else here
            if tag is None or tag == "!":
                tag = self.resolve(MappingNode, None, event.implicit)
            mapping = MappingNode(tag, [], start, None, flow_style=event.flow_style)
            if anchor is not None:
                self.anchors[anchor] = mapping
            while not ev.check_event(yaml.MappingEndEvent):
                key = self.node(path, depth + 1)
                name = key.value if isinstance(key, ScalarNode) else "<complex key>"
                mapping.value.append((key, self.node(_join(path, name), depth + 1)))
            mapping.end_mark = ev.get_event().end_mark
            node = mapping
        if anchor is not None:
            self.open_anchors.discard(anchor)
        return node


class _Checker:
    """One walk over the composed graph: size with aliases expanded, numeric magnitudes, duplicate keys."""

    def __init__(self, constructor: _Constructor) -> None:
        self.constructor = constructor
        self.weight: dict[int, int] = {}

    def walk(self, node: Node, path: str) -> int:
        seen = self.weight.get(id(node))
        if seen is not None:  # an alias: the same node again, already checked; it still counts in full
            return seen
        if isinstance(node, ScalarNode):
            self.scalar(node, path)
            total = 1
        elif isinstance(node, SequenceNode):
            total = 1 + sum(self.walk(child, _join(path, i)) for i, child in enumerate(node.value))
        elif isinstance(node, MappingNode):
            total = 1
            keys: set[Any] = set()
            for k, v in node.value:
                total += self.walk(k, path)
                name: Any = "<complex key>"
                if k.tag == MERGE_TAG:  # "<<: *defaults": merged by the constructor, keys below may repeat it
                    name = "<<"
                elif isinstance(k, ScalarNode):
                    try:
                        name = self.constructor.construct_object(k)
                        hash(name)
                    except (ValueError, TypeError, IndexError, OverflowError, KeyError, AttributeError) as e:
                        raise YamlError(path, f"invalid key {k.value!r} (tag {k.tag})", _line(k)) from e
                    if name in keys:
                        raise YamlError(_join(path, name), f"duplicate key {name!r}", _line(k))
                    keys.add(name)
                total += self.walk(v, _join(path, name))
        else:  # pragma: no cover - the composer makes only these three
            total = 1
        if total > MAX_NODES:
            raise YamlError(path, f"more than {MAX_NODES} values once aliases are expanded (an alias bomb?)",
                            _line(node))
        self.weight[id(node)] = total
        return total

    def scalar(self, node: ScalarNode, path: str) -> None:
        if node.tag not in (INT_TAG, FLOAT_TAG):
            return
        literal = str(node.value)
        if len(literal) > MAX_LITERAL:
            raise YamlError(path, f"number literal of {len(literal)} characters is too large "
                            f"(integers at most 2**64)", _line(node))
        try:
            value = self.constructor.construct_object(node)
        except (ValueError, IndexError, OverflowError, TypeError) as e:  # an explicit !!int / !!float on garbage
            raise YamlError(path, f"not a valid number: {literal!r}", _line(node)) from e
        if node.tag == INT_TAG and abs(value) > MAX_INT:
            raise YamlError(path, f"integer {literal} is too large (at most 2**64)", _line(node))
        if node.tag == FLOAT_TAG and math.isinf(value) and not _EXPLICIT_INF.match(literal):
            raise YamlError(path, f"number {literal} is too large (overflows to infinity)", _line(node))


def loads(text: str) -> Any:
    """Parse one YAML document within the bounds; None for an empty or comment-only document."""
    composer = _Composer(text)
    try:
        node = composer.single()
        if node is None:
            return None
        constructor = _Constructor()
        _Checker(constructor).walk(node, "")
        try:
            return constructor.construct_document(node)
        except (ValueError, TypeError, IndexError, OverflowError, KeyError, AttributeError) as e:
            # PyYAML's constructors on a bad explicitly tagged value (!!timestamp, !!binary, !!set ...)
            raise YamlError("", f"invalid value: {e}") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise YamlError("", f"invalid YAML: {problem}", None if mark is None else int(mark.line) + 1) from e
    finally:
        composer.close()


def read(path: str | os.PathLike[str], *, limit: int = MAX_BYTES) -> str:
    """A regular file's text, at most ``limit`` bytes of UTF-8; YamlError saying why otherwise."""
    try:
        # O_NONBLOCK: opening a FIFO put in the file's place returns at once (then refused) instead of blocking.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise YamlError("", f"cannot read: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise YamlError("", "not a regular file")
        if st.st_size > limit:
            raise YamlError("", f"{st.st_size} bytes, larger than the {limit}-byte limit")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, min(1 << 16, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # grew after the fstat
                raise YamlError("", f"larger than the {limit}-byte limit")
    except OSError as e:
        raise YamlError("", f"cannot read: {e.strerror or e}") from e
    finally:
        os.close(fd)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise YamlError("", f"not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})") from e


def load(path: str | os.PathLike[str] | Path, *, limit: int = MAX_BYTES) -> Any:
    """:func:`read` then :func:`loads`."""
    return loads(read(path, limit=limit))
