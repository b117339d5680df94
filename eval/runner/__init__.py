"""The run of ``chexpercept run`` (``eval/run.py`` is the command): ``plan`` (every decision of the
command, typed, made once), ``execute`` (the oracle settings in turn on one backend), and what keeps
a long run true: ``identity`` (everything that can change an answer, checked on resume), ``store``
(the run folder: results, run.json, lock), ``work_queue`` (cases shared by the processes of a
run), ``distributed`` (accelerate's processes), ``interrupts`` (stop signals), ``outcome`` (the
one-line end of a run that cannot finish), ``preflight`` (the engine's limits, checked before it
loads), ``selection`` and ``provenance``."""
