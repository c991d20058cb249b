"""Reading a spec file: strict, bounded YAML, every problem a StudyError naming the file.

Split from spec.py (which turns the mapping into runs) because reading untrusted YAML safely is its
own job: a SafeLoader that also refuses duplicate and unhashable keys, and aliases that expand past
a size or depth limit (a few hundred bytes of "billion laughs" would otherwise take minutes and GBs in
validation, error messages and hashing), plus `short`, the bounded repr every error message uses.
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml

from study.errors import StudyError

# --------------------------------------------------------------------------- reading YAML, bounded
# A spec is a hand-written file of a few KB (the largest shipped one is 3 KB). The limits below are far
# above that and far below what hurts: PyYAML's pure-Python parser reads ~0.7 MB/s here, and aliases can
# make a small file expand exponentially ("billion laughs"), which every later step (validation, repr
# in an error message, duplicate checks, hashing) would walk in full.
MAX_SPEC_BYTES = 256 * 1024
MAX_NODES = 20_000  # YAML nodes after expanding aliases
MAX_DEPTH = 40  # nesting levels after expanding aliases (the shipped specs use 4)
MERGE_TAG = "tag:yaml.org,2002:merge"
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 60, 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6


def short(value: Any, limit: int = 120) -> str:
    """repr(value) for an error message, bounded in time and length whatever the value is."""
    return clip(_REPR.repr(value), limit)


def clip(text: str, limit: int = 60) -> str:
    """A text (a key written in the spec) cut to `limit` characters for a message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses what yaml.safe_load lets through.

    - two equal keys (safe_load keeps the last silently; the same factor twice is a mistake);
    - unhashable keys (`? [a, b]: 1`), which would otherwise escape as a TypeError;
    - more than MAX_DEPTH nesting levels or MAX_NODES nodes once aliases are expanded, and aliases
      that contain themselves. Checked on the composed node graph, where an alias is the anchored
      node itself, so the check costs one visit per distinct node however large the expansion.
    Errors raise `SpecLimitError` with the dotted path of the offending value.
    """

    def __init__(self, stream):
        super().__init__(stream)
        self._path: list[str] = []

    def compose_node(self, parent, index):
        # PyYAML composes recursively: bound the depth before Python's recursion limit is reached
        step = (
            (index.value if isinstance(index, yaml.ScalarNode) else "?")
            if isinstance(parent, yaml.MappingNode)
            else f"[{index}]"
            if isinstance(parent, yaml.SequenceNode)
            else None
        )
        if step is not None:
            self._path.append(step)
        try:
            if len(self._path) > MAX_DEPTH:
                raise SpecLimitError(f"nested deeper than {MAX_DEPTH} levels", _dotted(self._path))
            return super().compose_node(parent, index)
        finally:
            if step is not None:
                self._path.pop()

    def fetch_flow_collection_start(self, TokenClass):
        # The scanner runs ahead of the composer through unclosed '[' / '{' (each might open a simple
        # key) and checks its pending keys once per level per token: 5000 nested brackets took seconds,
        # a file of them hours. Stop at the limit here, where the scanner counts levels itself.
        if self.flow_level >= MAX_DEPTH:
            raise SpecLimitError(
                f"nested deeper than {MAX_DEPTH} levels ('[' / '{{' at line {self.get_mark().line + 1})",
                _dotted(self._path) or "(document)",
            )
        super().fetch_flow_collection_start(TokenClass)

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:  # `<<: *base`: merged keys may be overridden, that is the point
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"a key must be a scalar (text or a number), got a {type(key).__name__}",
                    key_node.start_mark,
                ) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {short(key)}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class SpecLimitError(yaml.YAMLError):
    def __init__(self, problem: str, path: str):
        super().__init__(problem)
        self.problem, self.path = problem, path


def _dotted(steps: list[str]) -> str:
    return "".join(s if s.startswith("[") else f".{s}" for s in steps).lstrip(".")


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expansion(root) -> None:
    """Size and depth of the document with every alias expanded, computed per distinct node (memo),
    iteratively (an alias chain can be deeper than Python's stack); a node inside itself is refused."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()  # expanded, not finished: exactly the nodes on the current path
    stack = [root]
    while stack:
        node = stack[-1]
        k = id(node)
        if k in size:
            stack.pop()
        elif k not in open_:
            open_.add(k)
            for child in _children(node):
                if id(child) in open_:
                    raise SpecLimitError(
                        "an alias refers to a node that contains it (a recursive structure)",
                        _path_to(root, child),
                    )
                if id(child) not in size:
                    stack.append(child)
        else:
            stack.pop()
            open_.discard(k)
            kids = _children(node)
            # capped: a billion-laughs count would otherwise grow into a huge int for nothing
            size[k] = min(MAX_NODES + 1, 1 + sum(size[id(c)] for c in kids))
            depth[k] = min(MAX_DEPTH + 1, 1 + max((depth[id(c)] for c in kids), default=0))
    for what, table, limit in (("nodes", size, MAX_NODES), ("levels", depth, MAX_DEPTH)):
        if table[id(root)] > limit:
            raise SpecLimitError(
                f"expands to more than {limit} {what} through YAML aliases (&anchor / *alias)",
                _largest_path(root, table, limit),
            )


def _largest_path(root, table: dict[int, int], limit: int) -> str:
    """The dotted key path down to the deepest mapping value still over `limit`: the field to fix."""
    steps, node = [], root
    while isinstance(node, yaml.MappingNode):
        over = [(k, v) for k, v in node.value if table.get(id(v), 0) > limit]
        if not over:
            break
        key, node = over[0]
        steps.append(key.value if isinstance(key, yaml.ScalarNode) else "?")
    return _dotted(steps) or "(document)"


def _path_to(root, target) -> str:
    """The first dotted path (breadth-first, over mapping keys and list indices) that reaches `target`."""
    queue, seen = [(root, [])], {id(root)}
    while queue:
        node, steps = queue.pop(0)
        if node is target:
            return _dotted(steps) or "(document)"
        pairs = (
            [((k.value if isinstance(k, yaml.ScalarNode) else "?"), v) for k, v in node.value]
            if isinstance(node, yaml.MappingNode)
            else [(f"[{i}]", v) for i, v in enumerate(node.value)]
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        for step, child in pairs:
            if id(child) not in seen:
                seen.add(id(child))
                queue.append((child, [*steps, step]))
    return "(document)"


def read_yaml(path: Path) -> dict:
    """The spec file as a mapping; any problem with the file itself is a StudyError naming it."""
    src = str(path)
    try:
        if not path.exists():
            raise StudyError("spec file does not exist", source=src, allowed="an existing .yaml spec file")
        if not path.is_file():
            raise StudyError(
                "is not a file" + (" but a folder" if path.is_dir() else ""),
                source=src,
                allowed="a .yaml spec file",
            )
        with open(path, "rb") as f:  # read at most the limit: st_size can be 0 for special files
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise StudyError(
            f"cannot read the spec file ({exc.strerror or type(exc).__name__})", source=src
        ) from None
    if len(data) > MAX_SPEC_BYTES:
        raise StudyError(
            f"larger than {MAX_SPEC_BYTES // 1024} KiB: not a hand-written spec",
            source=src,
            allowed=f"a spec file of at most {MAX_SPEC_BYTES // 1024} KiB",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StudyError(f"not UTF-8 ({exc.reason} at byte {exc.start})", source=src) from None
    loader = _UniqueKeyLoader(text)  # a SafeLoader: no Python objects, only YAML's own types
    try:
        doc = loader.get_single_data()
    except SpecLimitError as exc:
        raise StudyError(
            exc.problem,
            field=exc.path,
            source=src,
            allowed=f"at most {MAX_NODES} values and {MAX_DEPTH} levels once aliases are expanded, "
            "no alias inside its own anchor",
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        kind = "YAML error" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise StudyError(
            f"{kind}{where}: {getattr(exc, 'problem', None) or short(exc)}", source=src
        ) from None
    finally:
        loader.dispose()
    if not isinstance(doc, dict):
        raise StudyError(
            f"a spec must be a YAML mapping with at least `name`, got {type(doc).__name__}", source=src
        )
    return doc
