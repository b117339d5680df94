"""The start-up hook: ``load_dataset("chexpercept", ...)`` and ``evaluate.load("chexpercept_metric")``
work in a fresh interpreter with nothing imported first.

This file's source is written, at install time, into ``chexpercept-startup.pth`` in site-packages
(setup.py), which Python runs while it starts. It imports nothing but ``sys`` and puts one finder
on ``sys.meta_path`` that answers nothing itself: when ``datasets`` or ``evaluate`` is first
imported, it imports ``chexpercept.registration`` (light) and lets it register our builder and our
metric right after that library has loaded. Anything that goes wrong leaves the import alone.
``CHEXPERCEPT_NO_STARTUP_HOOK=1`` turns it off (the .pth line checks it before running this).

Its second job: a Python process that a run's engine spawned dies with the run's process
(``CHEXPERCEPT_DIE_WITH_PARENT`` names it while ``chexpercept.eval.runner.interrupts.shielded_children``
starts the engine; that module decides, and it is imported only where the variable is set).

Run as the .pth's code, ``__name__`` is ``chexpercept_startup``; importing ``chexpercept.startup``
gives the same class for tests (``install()`` is then a no-op when the hook is already there).
"""

import sys

WATCHED = ("datasets", "evaluate")
#: names the run's process that a process started by its engine dies with (eval/runner/interrupts.py)
PARENT_VARIABLE = "CHEXPERCEPT_DIE_WITH_PARENT"


class ChexperceptStartupHook:
    """A meta path finder that finds nothing; see the module docstring."""

    #: marks our finders, which chexpercept.registration skips when it asks for the real module
    chexpercept_hook = True

    def __init__(self):
        self.waiting = set(WATCHED)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.waiting:
            return None
        self.waiting.discard(fullname)
        if not self.waiting:
            self.remove()
        try:
            from chexpercept import registration
        except Exception:  # chexpercept removed or broken: never break the user's import
            self.remove()
            return None
        return registration.spec_after_import(fullname, path, target)

    def remove(self):
        while self in sys.meta_path:
            sys.meta_path.remove(self)


def install():
    """Put the hook first on ``sys.meta_path`` unless one is there; returns the hook in use."""
    for finder in sys.meta_path:
        if type(finder).__name__ == "ChexperceptStartupHook":
            return finder
    hook = ChexperceptStartupHook()
    sys.meta_path.insert(0, hook)
    return hook


def follow_parent():
    """Die with the process ``CHEXPERCEPT_DIE_WITH_PARENT`` names when it is this one's parent
    (``chexpercept.eval.runner.interrupts.follow_parent``, imported only where the variable is set)."""
    import os  # already imported by site: free

    if not os.environ.get(PARENT_VARIABLE):
        return
    try:
        from chexpercept.eval.runner.interrupts import follow_parent as follow
    except Exception:  # chexpercept removed or broken: leave the process alone
        return
    follow()


if __name__ == "chexpercept_startup":
    install()
    follow_parent()
