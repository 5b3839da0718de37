"""Config files read as YAML, with every error located: a file that is not YAML, or that gives a
key twice (PyYAML would keep the last value silently), raises ConfigError naming the file,
line and column. The Snakefile, ``scalelab check-config`` and the logger plugin read config
files through here; what the content means is :mod:`scalelab.planning.validation`'s job."""
from __future__ import annotations

from pathlib import Path

import yaml

from scalelab.config import ConfigError


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last
    value silently), naming the key's dotted path and both lines."""

    def get_single_node(self):
        self._root = super().get_single_node()
        return self._root

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    earlier = first.setdefault(key, key_node)
                except TypeError:  # an unhashable key: SafeLoader's own error follows
                    continue
                if earlier is not key_node:
                    name = ".".join([*self._path_to(node), str(key)]).replace(".[", "[")
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {name} (first given on line {earlier.start_mark.line + 1}; "
                        "YAML would keep the last value silently)", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def _path_to(self, target, node=None, path=()) -> list[str]:
        """Dotted key path from the document's root to a mapping node."""
        node = self._root if node is None else node
        if node is target:
            return list(path)
        children = ()
        if isinstance(node, yaml.MappingNode):
            children = ((str(k.value), v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            children = ((f"[{i}]", v) for i, v in enumerate(node.value))
        for name, child in children:
            found = self._path_to(target, child, (*path, name))
            if found is not None:
                return found
        return None if path else []


def read_yaml(path: str | Path):
    """A config file's content (UniqueKeyLoader); ConfigError naming file, line and column
    when it is not valid YAML or gives a key twice."""
    path = Path(path)
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{path}: not valid YAML at {where}: {problem}") from None


def check_yaml_syntax(path: str | Path) -> None:
    """Raise ConfigError naming file, line and column when a config file is not valid YAML or
    gives a key twice (Snakemake's own parser names neither, and keeps the last value)."""
    if Path(path).exists():
        read_yaml(path)


def key_lines(path: str | Path) -> dict[tuple, int]:
    """The line (1-based) of every key and list item of a YAML file, by key path: ``("model",
    "n_layers")`` for a key, ``("sweep", "precision", 1)`` for a list's second item. Read from the
    parser's nodes (yaml.compose), which keep the positions that loaded values lose."""
    root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    lines: dict[tuple, int] = {}

    def walk(node, at: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value in node.value:
                inner = (*at, str(key_node.value))
                lines[inner] = key_node.start_mark.line + 1
                walk(value, inner)
        elif isinstance(node, yaml.SequenceNode):
            for i, value in enumerate(node.value):
                lines[(*at, i)] = value.start_mark.line + 1
                walk(value, (*at, i))

    walk(root, ())
    return lines


def shown(path: str | Path) -> str:
    """A file's name as the user would type it: relative to the working directory when under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def locate(key: tuple, files: list[str | Path]) -> str | None:
    """``file:line`` of the config file that sets ``key``: files are merged in order, so the last
    one that sets it wins (a later file's list replaces an earlier one's, its mappings merge).
    When no file sets the key itself (a default, a --config value), the longest part of its path
    that one sets; None when no file sets any of it, or no file can be read."""
    tables = []
    for path in files:
        try:
            tables.append((path, key_lines(path)))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):  # their own errors are reported apart
            continue
    for length in range(len(key), 0, -1):
        for path, lines in reversed(tables):
            if key[:length] in lines:
                return f"{shown(path)}:{lines[key[:length]]}"
    return None
