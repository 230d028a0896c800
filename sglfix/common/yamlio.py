"""Safe YAML loading that remembers line numbers, so schema errors can cite file:line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from sglfix.common.errors import ConfigError

__all__ = ["MAX_FILE_BYTES", "LineDict", "LineList", "line_of", "load_yaml", "read_regular_bytes", "read_text_file"]


class LineDict(dict):
    """A mapping that knows the line of itself and of each of its keys (1-based)."""

    line: int = 0
    key_lines: dict[str, int]


class LineList(list):
    line: int = 0
    item_lines: list[int]


def line_of(node: Any, key: Any = None) -> int:
    if key is not None and isinstance(node, LineDict):
        return node.key_lines.get(key, node.line)
    if key is not None and isinstance(node, LineList) and isinstance(key, int):
        return node.item_lines[key] if key < len(node.item_lines) else node.line
    return getattr(node, "line", 0)


MAX_ALIASES = 32  # aliases of aliases multiply: a few lines can stand for billions of nodes


class _Loader(yaml.SafeLoader):
    """SafeLoader (no arbitrary objects) that records lines and refuses duplicate keys, merge
    keys and more than ``MAX_ALIASES`` aliases."""

    aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise ConfigError(
                    f"{self.name}:{mark.line + 1}: more than {MAX_ALIASES} YAML aliases (*name); write the values out"
                )
        return super().compose_node(parent, index)


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    for key_node, _ in node.value:
        # Refused before anything is flattened: nested merges expand without bound.
        if key_node.tag == _MERGE_TAG:
            raise ConfigError(
                f"{loader.name}:{key_node.start_mark.line + 1}: YAML merge keys (<<) are not "
                f"supported; write the keys out"
            )
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise ConfigError(
                f"{loader.name}:{key_node.start_mark.line + 1}: a mapping key must be a plain value"
            ) from None
        if key in out:
            raise ConfigError(
                f"{loader.name}:{key_node.start_mark.line + 1}: duplicate key {key!r} "
                f"(first at line {out.key_lines[key]}); keep one"
            )
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml(text: str, *, source: str = "<yaml>") -> Any:
    """Parse ``text`` safely; any syntax problem becomes a one-line ConfigError."""
    if not isinstance(text, str):
        raise ConfigError(f"{source}: expected YAML text, got {type(text).__name__}")
    loader = _Loader(text)
    loader.name = source
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(f"{source}{line}: YAML syntax error: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: YAML error: {str(exc).splitlines()[0]}") from None
    finally:
        loader.dispose()


MAX_FILE_BYTES = 4 * 1024 * 1024


def read_regular_bytes(path: str | os.PathLike, *, what: str, max_bytes: int, fix: str) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, else a one-line ConfigError. A FIFO
    or a device would block or never end: refused before it is opened for reading."""
    import stat

    p = Path(path)
    st = p.stat()
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )
        raise ConfigError(f"{what} is {kind}, not a regular file; {fix}")
    if st.st_size > max_bytes:
        raise ConfigError(f"{what} is {st.st_size} bytes (limit {max_bytes}); is it the right file?")
    with open(p, "rb") as fh:
        data = fh.read(max_bytes + 1)  # a file that grows while read is cut here, not followed
    if len(data) > max_bytes:
        raise ConfigError(f"{what} is over {max_bytes} bytes (limit); is it the right file?")
    return data


def read_text_file(
    path: str | os.PathLike, *, what: str, max_bytes: int = MAX_FILE_BYTES, give: str = "a YAML file"
) -> str:
    """The text of a user-named file, or a one-line ConfigError that names the file and the fix.

    Directories, unreadable files, files over ``max_bytes``, binary files (a NUL byte) and text
    that is not UTF-8 are refused here, before anything is parsed or run; ``give``: what the
    messages ask for instead (a diff is not a YAML file).
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{what} {path} does not exist; check the path")
    if p.is_dir():
        raise ConfigError(f"{what} {path} is a directory; give {give}")
    try:
        data = read_regular_bytes(p, what=f"{what} {path}", max_bytes=max_bytes, fix=f"give {give}")
    except PermissionError:
        raise ConfigError(f"{what} {path} is not readable (permission denied); fix its permissions") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    if b"\x00" in data:
        raise ConfigError(f"{what} {path} is binary (holds NUL bytes); give {give}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{what} {path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        ) from None
