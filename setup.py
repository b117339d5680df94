"""Build step beyond pyproject.toml: the start-up hook, a .pth file at the top of site-packages.

Everything else about the package is declared in pyproject.toml. ``build_startup_hook`` writes
``chexpercept-startup.pth``: one line that Python runs while it starts, holding the source of
chexpercept/startup.py (a finder that waits for datasets or evaluate to be imported; it imports
nothing else), so that ``load_dataset("chexpercept", ...)`` and ``evaluate.load("chexpercept_metric")``
work with nothing imported first. In a wheel the file goes where build_py puts the packages; in an
editable install (pip install -e) it goes into the editable wheel itself.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build import build

PTH_NAME = "chexpercept-startup.pth"
#: relative to this file (setuptools wants /-separated relative paths for source files)
HOOK_SOURCE = "chexpercept/startup.py"


def pth_line(source: str) -> str:
    """The .pth line: Python runs lines that start with ``import``; the opt-out variable is read
    before anything else runs (``os`` is already imported by then)."""
    compile(source, "<chexpercept-startup.pth>", "exec")  # a syntax error fails the build, not start-up
    code = repr(source)
    return (
        "import os, sys; os.environ.get('CHEXPERCEPT_NO_STARTUP_HOOK') or exec(compile("
        f"{code}, '<chexpercept-startup.pth>', 'exec'), {{'__name__': 'chexpercept_startup'}})\n"
    )


class build_startup_hook(Command):
    """Write chexpercept-startup.pth next to the built packages (see the module docstring)."""

    description = "write the start-up hook (chexpercept-startup.pth)"
    user_options: list = []

    def initialize_options(self) -> None:
        self.build_lib = None
        self.editable_mode = False

    def finalize_options(self) -> None:
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def _targets(self) -> list[Path]:
        targets = [Path(self.build_lib)]
        if self.editable_mode:  # the editable wheel holds what install_lib points at, not build_lib
            targets.append(Path(self.get_finalized_command("install").install_lib))
        return targets

    def run(self) -> None:
        line = pth_line((Path(__file__).parent / HOOK_SOURCE).read_text(encoding="utf-8"))
        for folder in self._targets():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / PTH_NAME).write_text(line, encoding="utf-8")

    def get_outputs(self) -> list[str]:
        return [str(Path(self.build_lib) / PTH_NAME)]

    def get_source_files(self) -> list[str]:
        return [HOOK_SOURCE]


class build_with_startup_hook(build):
    sub_commands = [*build.sub_commands, ("build_startup_hook", None)]


if __name__ == "__main__":  # the build backend runs this file as __main__; tests import pth_line
    setup(cmdclass={"build": build_with_startup_hook, "build_startup_hook": build_startup_hook})
