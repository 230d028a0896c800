"""The command-line reference (``docs/reference/cli.md``), written from the app itself.

``python -m sglfix.cli.reference docs/reference/cli.md`` rewrites the file (no path: print it);
``tests/test_docs.py`` renders it again and fails when the committed file differs. Everything comes
from the click command tree typer builds, in registration order, with no terminal width involved:
the same app gives the same bytes on every machine.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

__all__ = ["REGENERATE", "render"]

REGENERATE = "python -m sglfix.cli.reference docs/reference/cli.md"

# Characters Markdown would read as markup in prose (a glob's *, a <pr> placeholder as an HTML tag,
# an underscore at a word's edge); one inside a word, as in SGLFIX_STORE, is plain text already.
_MARKUP = re.compile(r"([\\*<]|(?<!\w)_|_(?!\w))")
# click appends "  [default: x; required]" to an option's help; shown apart, as a sentence.
_EXTRA = re.compile(r"^(.*?)\s*\[([^\[\]]*)\]$", re.S)


def _prose(text: str) -> str:
    """Help text as Markdown: inline code kept as written, markup characters escaped elsewhere."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else _MARKUP.sub(r"\\\1", p) for p in parts)


def _help_text(command) -> str:
    text = inspect.cleandoc(command.help or "").split("\f")[0]
    lines = [line for line in text.splitlines() if line.strip() != "\b"]
    return "\n".join(lines).strip()


def _param_line(param, ctx) -> str | None:
    record = param.get_help_record(ctx)
    if record is None:  # hidden
        return None
    names, help_text = record
    help_text = " ".join(help_text.split())
    extras: list[str] = []
    m = _EXTRA.match(help_text)
    if m and re.match(r"(default|required|env var)\b", m.group(2)):
        help_text = m.group(1).strip()
        for item in m.group(2).split("; "):
            key, _, value = item.partition(": ")
            extras.append(f"{key.capitalize()}: `{value}`." if value else f"{key.capitalize()}.")
    line = f"- `{names}`"
    if help_text:
        line += f": {_prose(help_text)}"
    if extras:
        line += " " + " ".join(extras)
    return line


def _section(command, ctx, lines: list[str]) -> None:
    lines += [f"## {ctx.command_path}", ""]
    text = _help_text(command)
    # One line a paragraph: a help line that starts with "-" or "#" must not become Markdown markup.
    lines += [line for para in text.split("\n\n") if para.strip() for line in (_prose(" ".join(para.split())), "")]
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    lines += ["```text", usage, "```", ""]
    arguments = [p for p in command.params if getattr(p, "param_type_name", "") == "argument"]
    options = [p for p in command.params if p not in arguments]
    for title, params in (("Arguments", arguments), ("Options", options)):
        rendered = [line for p in params if (line := _param_line(p, ctx)) is not None]
        if rendered:
            lines += [f"{title}:", "", *rendered, ""]
    if hasattr(command, "commands"):
        subs = [(n, command.commands[n]) for n in command.list_commands(ctx) if not command.commands[n].hidden]
        lines += ["Commands:", ""]
        lines += [f"- [`{n}`](#{_anchor(f'{ctx.command_path} {n}')}): {_prose(_summary(c))}" for n, c in subs]
        lines.append("")
        for name, sub in subs:
            _section(sub, type(ctx)(sub, info_name=name, parent=ctx), lines)


def _summary(command) -> str:
    first = _help_text(command).split("\n\n")[0]
    return " ".join(first.split())


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def render() -> str:
    """The whole reference as Markdown."""
    from typer.main import get_command

    from sglfix.cli.app import app

    root = get_command(app)
    ctx = root.context_class(root, info_name="sglfix")
    lines = [
        "# Command-line reference",
        "",
        f"<!-- Written from the app by `{REGENERATE}`; a test fails when it is out of date. -->",
        "",
        "Every command of `sglfix`: its usage line, what it does, its arguments and options with their",
        "defaults, as `sglfix COMMAND --help` prints them. The first section's options are global: they",
        "go before the command.",
        "",
    ]
    _section(root, ctx, lines)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if not args or args == ["-"]:
        sys.stdout.write(text)
    else:
        Path(args[0]).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
