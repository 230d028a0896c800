"""Build hooks: every wheel, regular or editable, carries the start-up hook ``zz-sglfix-startup.pth``.

A ``.pth`` file in site-packages runs its ``import`` line in every Python process at start-up.
The ``zz-`` makes it run after the other ``.pth`` files, whose paths may hold sglfix's
dependencies;
this one reads SGLANG_DEBUG_REVERT_PR and returns at once when it selects nothing
(``sglfix.toggling.hook`` says what happens otherwise). A regular wheel built from a git checkout
also carries the commit it was built from (``sglfix.common.version``), which its reports record.
Everything else is in pyproject.toml.
"""

import functools
import importlib.util
import json
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "zz-sglfix-startup.pth"
PTH_TEXT = (Path(__file__).parent / PTH).read_bytes()


@functools.cache
def _source_record() -> tuple[str, bytes] | None:
    """The commit of the tree a regular wheel is built from (``sglfix.common.version``'s file),
    which the installed sglfix records in its reports; None outside a git checkout."""
    here = Path(__file__).parent
    spec = importlib.util.spec_from_file_location("_sglfix_version", here / "sglfix" / "common" / "version.py")
    version = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(version)
    found = version.git_source(str(here))
    if found["commit"] is None:
        return None
    return version.BUILD_FILE, (json.dumps(found) + "\n").encode()


class BuildPyWithStartupHook(build_py):
    """Regular wheels: the .pth lands next to the packages, at the root of site-packages."""

    def run(self):
        super().run()
        if not self.editable_mode:
            target = Path(self.build_lib) / PTH
            target.write_bytes(PTH_TEXT)
            record = _source_record()
            if record is not None:
                (Path(self.build_lib) / "sglfix" / record[0]).write_bytes(record[1])

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        record = _source_record()
        extra = [str(Path(self.build_lib) / "sglfix" / record[0])] if record is not None else []
        return [*outputs, str(Path(self.build_lib) / PTH), *extra]


class _StrategyWithStartupHook:
    """Wraps the editable strategy (a context manager called with the wheel being written)."""

    def __init__(self, inner):
        self.inner = inner

    def __enter__(self):
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)

    def __call__(self, wheel, files, mapping):
        self.inner(wheel, files, mapping)
        wheel.writestr(PTH, PTH_TEXT)


class EditableWheelWithStartupHook(editable_wheel):
    """Editable installs (``pip install -e .``): the same .pth, written into the editable wheel."""

    def _select_strategy(self, *args, **kwargs):
        return _StrategyWithStartupHook(super()._select_strategy(*args, **kwargs))


if not hasattr(editable_wheel, "_select_strategy"):  # pragma: no cover - a setuptools we do not know
    raise SystemExit(
        "sglfix: this setuptools has no editable_wheel._select_strategy; "
        "the start-up hook cannot go into an editable install (pip install . works)"
    )

setup(cmdclass={"build_py": BuildPyWithStartupHook, "editable_wheel": EditableWheelWithStartupHook})
