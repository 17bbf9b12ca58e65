"""YAML read safely, with the line of every key: the safe loader, bounded before anything is built (aliases, values,
nesting and the size once aliases expand), so a small hostile file cannot expand into gigabytes, loop through a
recursive alias or keep the parser busy for minutes. Errors are UsageError lines that name the file and line."""
from __future__ import annotations

from typing import Any

from optkit.core.errors import UsageError
from optkit.core.text import first_line

MAX_ALIASES = 100              # YAML aliases (*name); a "billion laughs" file needs many
MAX_NODES = 100_000            # YAML nodes once every alias is expanded
MAX_DEPTH = 64                 # nested mappings and lists; a recipe needs a handful


def _yaml_loader():
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: linear, and fast on hostile input


def yaml_with_lines(text: str, source: str) -> tuple[Any, dict[tuple, int]]:
    """Parse YAML with the safe loader, and record the line of every key and list item.

    Bounded before anything is built: at most MAX_ALIASES aliases, MAX_NODES values as written, MAX_DEPTH levels
    of nesting (one streaming pass over the events, stopped at the first excess), then at most MAX_NODES nodes
    once aliases are expanded, so a small file cannot expand into gigabytes ("billion laughs"), loop through a
    recursive alias, or keep the parser busy for minutes.
    """
    import yaml

    loader_cls = _yaml_loader()
    try:
        _check_events(yaml.parse(text, Loader=loader_cls), source)
        loader = loader_cls(text)
        try:
            node = loader.get_single_node()
            _check_expansion(node, source)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(e, "problem", None) or first_line(e)
        raise UsageError(f"{where}: not valid YAML: {problem}") from None
    except RecursionError:
        raise UsageError(f"{source}: the YAML is nested too deeply for a recipe") from None
    lines: dict[tuple, int] = {}

    def walk(n, path: tuple) -> None:
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = k.value
                lines[path + (key,)] = k.start_mark.line + 1
                walk(v, path + (key,))
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                lines[path + (i,)] = v.start_mark.line + 1
                walk(v, path + (i,))

    if node is not None:
        lines[()] = node.start_mark.line + 1
        walk(node, ())
    return data, lines


def _check_events(events, source: str) -> None:
    """Count aliases and values and follow the nesting while the parser streams; stop at the first excess."""
    import yaml

    aliases = nodes = depth = 0
    for e in events:
        if isinstance(e, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise UsageError(f"{source}:{e.start_mark.line + 1}: more than {MAX_ALIASES} YAML aliases (*name); "
                                 "write the recipe out without them")
        elif isinstance(e, (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            nodes += 1
            if nodes > MAX_NODES:
                raise UsageError(f"{source}: more than {MAX_NODES} YAML values; a recipe is a page of YAML")
            if not isinstance(e, yaml.ScalarEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise UsageError(f"{source}:{e.start_mark.line + 1}: the YAML is nested more than {MAX_DEPTH} "
                                     "levels deep; a recipe needs a handful")
        elif isinstance(e, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _check_expansion(root, source: str) -> None:
    """Refuse a YAML graph that is recursive or expands to more than MAX_NODES nodes (linear time: each node
    shared through aliases is sized once)."""
    import yaml

    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(n) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in active:
            raise UsageError(f"{source}:{n.start_mark.line + 1}: a YAML alias refers to itself (a recursive "
                             "structure); recipes cannot use one")
        active.add(id(n))
        total = 1
        if isinstance(n, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total += sum(size(v) for v in n.value)
        active.discard(id(n))
        sizes[id(n)] = total
        if total > MAX_NODES:
            raise UsageError(f"{source}: the YAML expands to more than {MAX_NODES} values through its aliases; "
                             "write the recipe out without them")
        return total

    if root is not None:
        size(root)
