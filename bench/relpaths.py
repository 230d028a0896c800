"""The absolute paths of the machine that made a result, rewritten into forms that mean the same on
any machine: what the committed results under bench/results hold, and what the bench scripts
write (``relativize`` before ``json.dump``).

    python bench/relpaths.py [FILE|DIR ...] [--check]     (default: bench/results)

A path                                                    becomes
inside this checkout                                      relative to its root (``backends/srt/...``)
under ``site-packages``, in a release folder of sglfix's  the package's own path: ``sglang``,
cache (``releases/sglang-0.5.22/``), or in a site folder  ``sglang/srt/...``, ``torch/cuda/...``,
of the GPU machine (``/tmp/site``, ``/tmp/sgsite``)        ``flashinfer/decode.py``
in the GPU machine's output folder (``$OUT``)              its name there (``matrix-cuda.json``)
in the standard library (``lib/python3.X/``)              its path there (``subprocess.py``)
under a temporary folder (``/tmp/sglfix-scale-x1y2/``)     ``<tmp>/`` and its path under the folder
                                                          the run made (``<tmp>/run1.json``)
under a home folder                                       ``~/...``

The same input gives the same output on any machine. JSON files are rewritten string by string:
only the strings that held such a path change, the rest of the file (indent, order, the last
newline) stays byte for byte; other text files line by line; binary files are left alone. A path
of the machine that none of the rules knows is listed and the exit status is 1 (the file is still
rewritten for the paths that are known). ``--check`` writes nothing: exit 1 if a file would change.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["relative", "relativize", "rewrite", "rewrite_file", "rewrite_json_text", "unknown_paths"]

ROOT = Path(__file__).resolve().parent.parent
TMP = "<tmp>"
# First folders of the absolute paths results hold (a URL's path or a relative one never starts so).
_MACHINE = r"(?:work|root|home|tmp|opt|usr|var|private|mnt|srv|scratch|data)"
_CHARS = r"[\w.+@%=*~/-]"
# Where bench/gpu_run.sh unpacks the GPU machine's packages (PYTHONPATH) and where its output lands.
SITE_FOLDERS = ("/tmp/site", "/tmp/sgsite")
OUT_FOLDERS = ("/root/out", "/tmp/sglfix-out")
_TEMP_FOLDERS = ("/tmp", "/var/tmp", "/private/tmp")
_RELEASE = re.compile(r"[A-Za-z][\w.]*-\d[\w.+]*")  # <distribution>-<version>, sglfix.codebases.releases
_STDLIB = re.compile(r"python3\.\d+")
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _roots() -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(p) for p in (ROOT, Path(os.path.realpath(ROOT)))))


def _outs() -> tuple[str, ...]:
    out = os.environ.get("OUT", "")
    return tuple(dict.fromkeys(([out.rstrip("/")] if out.startswith("/") and out != "/" else []) + list(OUT_FOLDERS)))


def _under(path: str, folder: str) -> str | None:
    """``path`` relative to ``folder`` ("." for the folder itself), None when it is not under it."""
    if path == folder or path == folder + "/":
        return "."
    return path[len(folder) + 1 :] if path.startswith(folder + "/") else None


def relative(path: str, *, roots: tuple[str, ...] = ()) -> str | None:
    """The form of the absolute ``path`` that holds on any machine (the table above), None when no
    rule knows it. ``roots``: checkouts besides this one (their files map relative to them)."""
    parts = path.split("/")
    # A package's own path first: an environment inside the checkout (.venv) is still an environment.
    for marker in ("site-packages", "dist-packages"):
        if marker in parts[:-1]:
            i = len(parts) - 1 - parts[::-1].index(marker)
            if any(parts[i + 1 :]):
                return "/".join(parts[i + 1 :])
    for i in range(len(parts) - 2):
        if parts[i] == "releases" and _RELEASE.fullmatch(parts[i + 1]) and any(parts[i + 2 :]):
            return "/".join(parts[i + 2 :])
    for folder in (*roots, *_roots()):
        if (rel := _under(path, folder)) is not None:
            return rel
    for folder in (*SITE_FOLDERS, *_outs()):
        if (rel := _under(path, folder)) not in (None, "."):
            return rel
    for i in range(len(parts) - 1):
        if parts[i] == "lib" and _STDLIB.fullmatch(parts[i + 1]) and any(parts[i + 2 :]):
            return "/".join(parts[i + 2 :])
    for folder in _TEMP_FOLDERS:
        if (rel := _under(path, folder)) not in (None, "."):
            # The folder the run made under it (mkdtemp's random name) is the machine's, not the run's.
            first, _, rest = rel.partition("/")
            return f"{TMP}/{rest or first}"
    if parts[1:2] == ["root"]:
        return "/".join(["~", *parts[2:]])
    if parts[1:2] == ["home"] and len(parts) > 3:
        return "/".join(["~", *parts[3:]])
    return None


def _pattern(roots: tuple[str, ...]) -> re.Pattern[str]:
    starts = [_MACHINE] + [re.escape(r.lstrip("/")) for r in (*roots, *_roots())]
    return re.compile(rf"(?<![\w.~/-])/(?:{'|'.join(starts)})(?:/{_CHARS}*)?(?!{_CHARS})")


def rewrite(text: str, *, roots: tuple[str, ...] = ()) -> str:
    """``text`` with every absolute path a rule knows in its relative form."""
    pattern = _pattern(roots)
    return pattern.sub(lambda m: relative(m.group(0), roots=roots) or m.group(0), text)


def unknown_paths(text: str, *, roots: tuple[str, ...] = ()) -> list[str]:
    """The absolute paths of a machine in ``text`` that no rule knows (left as they are)."""
    return [m.group(0) for m in _pattern(roots).finditer(text) if relative(m.group(0), roots=roots) is None]


def relativize(value: Any, *, roots: tuple[str, ...] = (), strict: bool = False) -> Any:
    """A JSON value with every string (keys included) rewritten. Two keys of one object that would
    become the same: ValueError when ``strict``, else the later one keeps its path (a bench's
    result is written whole; the committed-paths test names what is left)."""
    if isinstance(value, str):
        return rewrite(value, roots=roots)
    if isinstance(value, list | tuple):
        return [relativize(v, roots=roots, strict=strict) for v in value]
    if isinstance(value, dict):
        out: dict = {}
        for key, v in value.items():
            new = rewrite(key, roots=roots) if isinstance(key, str) else key
            if new in out:
                if strict:
                    raise ValueError(f"two keys become {new!r} (one of them {key!r})")
                print(f"relpaths: {key!r} kept as it is: another key already became {new!r}", file=sys.stderr)
                new = key
            out[new] = relativize(v, roots=roots, strict=strict)
        return out
    return value


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a key appears twice: {sorted(k for k in keys if keys.count(k) > 1)[0]!r}")
    return dict(pairs)


def rewrite_json_text(text: str, *, roots: tuple[str, ...] = ()) -> str:
    """A JSON document's text with the paths of its strings rewritten, the rest byte for byte;
    ValueError when it is not JSON or two keys of one object would become the same."""

    def one(m: re.Match[str]) -> str:
        literal = m.group(0)
        value = json.loads(literal)
        new = rewrite(value, roots=roots)
        # The writer's own choice for non-ASCII text: escaped unless the literal holds it as is.
        return literal if new == value else json.dumps(new, ensure_ascii=literal.isascii())

    new = _JSON_STRING.sub(one, text)
    # The text rewrite must be the value rewrite: a path split by an escape would differ.
    got = json.loads(new, object_pairs_hook=_no_duplicates)
    want = relativize(json.loads(text), roots=roots, strict=True)
    if json.dumps(got, sort_keys=True) != json.dumps(want, sort_keys=True):
        raise ValueError("rewriting its strings in place does not give the rewritten values")
    return new


def rewrite_file(path: Path, *, roots: tuple[str, ...] = ()) -> tuple[str | None, list[str]]:
    """(the file's new text, None when nothing changes or it is binary; the unknown paths left)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None, []
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None, []
    new = rewrite_json_text(text, roots=roots) if path.suffix == ".json" else rewrite(text, roots=roots)
    return (new if new != text else None), unknown_paths(new, roots=roots)


def _files(targets: list[str]) -> list[Path]:
    files: list[Path] = []
    for t in targets:
        p = Path(t)
        if not p.exists():
            raise SystemExit(f"relpaths: {t} does not exist; name files or folders of results")
        files += sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("paths", nargs="*", default=[str(ROOT / "bench" / "results")], metavar="FILE|DIR")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    ap.add_argument("--root", action="append", default=[], help="another checkout whose files map relative to it")
    args = ap.parse_args(argv)
    roots = tuple(r.rstrip("/") for r in args.root)
    status = 0
    for f in _files(args.paths):
        try:
            new, unknown = rewrite_file(f, roots=roots)
        except ValueError as exc:  # JSON that is not JSON, or keys that would collide
            print(f"{f}: left as it is: {exc}", file=sys.stderr)
            status = 1
            continue
        if new is not None:
            status = 1 if args.check else status
            if not args.check:
                tmp = f.with_name(f".{f.name}.relpaths")
                tmp.write_bytes(new.encode())
                os.replace(tmp, f)
            print(f"{f}: {'would be ' if args.check else ''}rewritten")
        for p in dict.fromkeys(unknown):
            print(f"{f}: no rule for {p}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
