"""What one ``chexpercept run`` command will do, decided once: ``RunPlan``.

``build_plan(args, dist)`` turns the parsed options into a typed, immutable plan, in the order that
makes a wrong argument fail first: the model and its backend's options (a bad flag fails before
anything is read), the release folder, the weights (resolved and fetched once per machine before
any engine starts), then the bundle with its images checked and the cases selected. The runner
(``chexpercept.eval.runner.execute``) takes the plan and the backend built from it.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

from chexpercept.bundle import Bundle, check_release_dir, read_bundle
from chexpercept.case import Case
from chexpercept.cli_options import progress_enabled
from chexpercept.domains import COUNT, SEED
from chexpercept.escape import terminal
from chexpercept.eval.backends import backend_class, refuse_unread_options
from chexpercept.eval.backends.options import BackendOptions
from chexpercept.eval.oracle import end_to_end_note, oracles_for
from chexpercept.eval.protocol import Backend, Sampling
from chexpercept.eval.registry import ModelSpec, resolve, run_folder_name
from chexpercept.eval.runner.distributed import Distributed
from chexpercept.eval.runner.selection import select_cases, selection_notes, split_list
from chexpercept.eval.weights import prepare_model, runs_remote_code
from chexpercept.results import RESULTS_NAME, RUN_NAME
from chexpercept.run_metadata import Selection


@dataclass(frozen=True)
class RunPlan:
    """Every decision of one run command (see the module docstring)."""

    #: the model as named (registry entry, Hub id or folder): names and records
    model: ModelSpec
    #: the model as the backend loads it (a Hub model: its snapshot folder)
    load: ModelSpec
    #: the backend's own options (its ``Options``), as parsed and checked
    options: BackendOptions
    #: decoding as sent and recorded
    sampling: Sampling
    chat_kwargs: dict[str, Any]
    #: most conversations live at once per process
    batch_size: int
    bundle: Bundle
    #: the selected cases, in bundle order
    cases: tuple[Case, ...]
    selection: Selection
    #: oracle settings to run, in turn, on one backend
    oracles: tuple[str, ...]
    parse_mode: str
    #: what a failed request does: "stop" the run, or "record" the case as unfinished
    on_error: str
    #: the seed as applied and recorded (``seed_for``): None where the openai backend sends none
    seed: int | None
    #: the weights' record for run.json (Hub: revision and commit), None without weights
    weights: dict[str, Any] | None
    output_dir: FsPath
    run_name: str | None
    progress: bool
    #: print the model's Table 2 at the end
    score: bool
    #: the command line as recorded (secrets redacted)
    command: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        # the one gate of every model folder's name (eval/registry.py: run_folder_name)
        if self.run_name is None:
            run_folder_name(self.model.name, option="the model's folder name")
        else:
            run_folder_name(self.run_name)

    @property
    def name(self) -> str:
        """The folder name of the model's runs (``--run-name`` or the model's name)."""
        return self.run_name if self.run_name is not None else self.model.name

    @property
    def display_name(self) -> str:
        return self.model.display or self.model.name

    def model_folder(self) -> FsPath:
        return self.output_dir / self.name

    def run_folder(self, oracle: str) -> FsPath:
        return self.model_folder() / f"oracle_{oracle}"

    def backend(self) -> Backend:
        """A new backend for this plan (not set up)."""
        return make_backend(self.load, self.options, self.sampling, self.chat_kwargs, self.on_error)


def make_backend(
    spec: ModelSpec, options: BackendOptions, sampling: Sampling, chat_kwargs: dict[str, Any], on_error: str
) -> Backend:
    """The backend ``spec`` names, built from its typed options (chexpercept.eval.backends)."""
    return backend_class(spec.backend).from_plan(
        spec, options, sampling=sampling, chat_template_kwargs=chat_kwargs, on_error=on_error
    )


#: the answer-length fields of a chat completions request: the openai backend sends the first
LENGTH_FIELDS = ("max_completion_tokens", "max_tokens")
#: request fields the run itself decides and records; --request-extra may not replace them
OWN_FIELDS = ("model", "messages", "chat_template_kwargs")


def sampling_for(spec: ModelSpec, args: argparse.Namespace) -> Sampling:
    """Decoding as sent and recorded: the registry's, then the options, then what the request's
    fields send instead (the openai backend: ``ModelSpec.request_fields``; a field they set or
    remove is what the server gets, so it is what run.json records). ValueError for request fields
    whose decoding run.json could not record: a length that is not a count, two different lengths,
    no length at all (the server's own), or a field the run decides itself (the model...)."""
    base = spec.sampling
    temperature = base["temperature"] if args.temperature is None else args.temperature
    top_p = base["top_p"] if args.top_p is None else args.top_p
    max_tokens = base["max_tokens"] if args.max_tokens is None else args.max_tokens
    COUNT.require(max_tokens, "--max-tokens")
    if spec.backend != "openai":  # a local engine applies a top_p always (1.0: none)
        top_p = 1.0 if top_p is None else top_p
        return Sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens, greedy=temperature == 0)
    fields = spec.request_fields(getattr(args, "request_extra", None))
    own = [k for k in OWN_FIELDS if k in fields]
    if own:
        raise ValueError(
            f"--request-extra may not set {', '.join(own)}: the run decides it and run.json records "
            "it (the model: --model, or --model-id for a served name; chat template variables: "
            "--chat-template-kwargs or --no-thinking)"
        )
    for key, given in (("temperature", args.temperature), ("top_p", args.top_p)):
        if given is not None and key in fields and fields[key] != given:  # one would silently win
            raise ValueError(
                f"--{key.replace('_', '-')} {given:g} and {key} {fields[key]!r} in --request-extra: give one"
            )
    if "temperature" in fields:
        temperature = fields["temperature"]  # None: the server's default, so not known to be greedy
    if "top_p" in fields:
        top_p = fields["top_p"]  # None: removed, so the server's default applies
    sent = {LENGTH_FIELDS[0]: max_tokens} | {k: fields[k] for k in LENGTH_FIELDS if k in fields}
    sent = {k: v for k, v in sent.items() if v is not None}  # a null removes the field
    for key, value in sent.items():
        COUNT.require(value, f"{key} in --request-extra")
    if not sent:
        raise ValueError(
            f"--request-extra removes {' and '.join(LENGTH_FIELDS)}: the answer length would be the "
            "server's own, which run.json cannot record; give it with --max-tokens"
        )
    shown = ", ".join(f"{k} {v}" for k, v in sent.items())
    if len(set(sent.values())) > 1:
        raise ValueError(f"--request-extra sends two answer lengths ({shown}): give one")
    max_tokens = next(iter(sent.values()))
    if args.max_tokens is not None and max_tokens != args.max_tokens:
        raise ValueError(f"--max-tokens {args.max_tokens} and {shown} in --request-extra: give one")
    return Sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens, greedy=temperature == 0)


def seed_for(spec: ModelSpec, args: argparse.Namespace) -> int | None:
    """The seed as applied, so as recorded: a local backend applies ``--seed`` (0 when not given);
    the openai backend sends a seed only when one is given (``--seed``, or ``seed`` in the request
    fields: ``ModelSpec.request_fields``), else None: the server's own randomness. ValueError for two
    different seeds, or a request field's seed outside ``--seed``'s domain."""
    given = getattr(args, "seed", None)
    if spec.backend != "openai":
        return 0 if given is None else given
    fields = spec.request_fields(getattr(args, "request_extra", None))
    if "seed" not in fields:
        return given
    seed = fields["seed"]
    if seed is not None:
        SEED.require(seed, "seed in --request-extra")
    if given is not None and seed != given:
        raise ValueError(f"--seed {given} and seed {seed!r} in --request-extra: give one")
    return seed


#: what makes a local folder a model an engine loads: transformers' and vLLM's config, or a Mistral
#: format's params
MODEL_FOLDER_FILES = ("config.json", "params.json")


def check_model_folder(spec: ModelSpec) -> None:
    """ValueError naming the folder when a backend that loads a model (one with ``engine_packages``)
    is given a local folder that holds none: the engine's own words ("Unrecognized processing
    class") came after the bundle was read and the run folder made (new user, stop 45)."""
    folder = os.path.expanduser(spec.model_id)
    if not backend_class(spec.backend).engine_packages or not os.path.isdir(folder):
        return
    if any(os.path.isfile(os.path.join(folder, name)) for name in MODEL_FOLDER_FILES):
        return
    if os.path.isfile(os.path.join(folder, "chexpercept.json")):
        raise ValueError(
            f"--model {terminal(spec.model_id)} is a CheXpercept release (it holds chexpercept.json), not a "
            "model: give it as --data-dir, and as --model a model folder, a Hub id or a registry name"
        )
    raise ValueError(
        f"--model {terminal(spec.model_id)} is a folder without a model in it (no {' or '.join(MODEL_FOLDER_FILES)}): "
        "give a folder that save_pretrained wrote, a Hub id or a registry name (chexpercept run --list-models)"
    )


#: the files of a model folder that may hold its chat template (a ``chat_template`` field in the JSON ones)
TEMPLATE_FILES = (
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer_config.json",
    "processor_config.json",
)


def template_reads(folder: str, variable: str) -> bool | None:
    """Whether the chat template of the local model ``folder`` reads ``variable`` (its name appears
    in a template); None where that cannot be told here (not a local folder, no template in it, a
    file that cannot be read)."""
    from chexpercept.input_files import MODEL_FILE, read_input_text
    from chexpercept.input_json import loads

    if not os.path.isdir(folder):
        return None
    texts: list[str] = []
    try:
        for name in TEMPLATE_FILES:
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                continue
            text = read_input_text(path, MODEL_FILE, what="chat template")
            if name.endswith(".jinja"):
                texts.append(text)
                continue
            template = loads(text, source=path).get("chat_template")
            if isinstance(template, str):
                texts.append(template)
            elif isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
                texts += [t.get("template", "") for t in template if isinstance(t, dict)]
    except (OSError, ValueError, AttributeError):
        return None
    return any(variable in t for t in texts) if texts else None


def chat_kwargs_for(spec: ModelSpec, args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """chat_template_kwargs and, if --no-thinking does not apply to this model, a note saying so: a
    registry model says whether its template has the switch; a local model's template is read for
    it (``template_reads``); elsewhere (a Hub or served model outside the registry) it is sent."""
    kwargs: dict[str, Any] = {}
    note = None
    if args.no_thinking:
        reads = None if spec.in_registry else template_reads(spec.model_id, "enable_thinking")
        if spec.thinking_switch or (not spec.in_registry and reads is not False):
            kwargs["enable_thinking"] = False
        else:
            note = f"--no-thinking has no effect on {spec.name} (its chat template has no thinking switch)"
    given = args.chat_template_kwargs or {}
    if "enable_thinking" in given and not isinstance(given["enable_thinking"], bool):
        raise ValueError(  # a template reads the string "false" as true
            f"--chat-template-kwargs: enable_thinking must be true or false, got {given['enable_thinking']!r}"
        )
    if kwargs and given.get("enable_thinking", False) is not False:
        raise ValueError("--no-thinking and enable_thinking true in --chat-template-kwargs: give one")
    kwargs.update(given)
    return kwargs, note


def oracles_of(args: argparse.Namespace, sampling: Sampling) -> tuple[str, ...]:
    """The oracle settings asked for, each once, in the order given (``paper`` expanded for this
    model's decoding: chexpercept.eval.oracle.oracles_for)."""
    given = args.oracle if isinstance(args.oracle, list) else [args.oracle]
    return oracles_for(given, greedy=sampling.greedy)


def check_output_dir(output_dir: str | os.PathLike[str], *, model: str, data_dir: str | None) -> None:
    """ValueError unless ``--output-dir`` can hold model folders: not inside the local model's folder
    nor the release (a run there changes the files whose fingerprint the run's identity holds, so it
    could never resume), and not itself a model's or a run's folder (its runs would be a model
    inside a model, counted twice by ``score``)."""
    out = FsPath(output_dir).expanduser().resolve()
    local = FsPath(model).expanduser()
    for what, folder in (
        ("the model's folder", local if local.is_dir() else None),
        ("the release (--data-dir)", data_dir),
    ):
        if folder is None:
            continue
        inside = FsPath(folder).expanduser().resolve()
        if out == inside or inside in out.parents:
            raise ValueError(
                f"--output-dir {terminal(str(output_dir))} is inside {what} {terminal(str(folder))}: a run "
                "there would change the files the run's identity fingerprints; choose a folder outside it"
            )
    if out.is_dir() and (
        out.name.startswith("oracle_")
        or any((out / name).exists() for name in (RESULTS_NAME, RUN_NAME))
        or any(p.is_dir() for p in out.glob("oracle_*"))
    ):
        raise ValueError(
            f"--output-dir {terminal(str(output_dir))} is a model's or a run's folder (it holds oracle_* "
            "folders or a run's files): give the folder above it, which holds the model folders"
        )


def build_plan(args: argparse.Namespace, dist: Distributed) -> tuple[RunPlan, Backend]:
    """The plan of ``args`` and its backend (built, not set up); see the module docstring."""
    if args.run_name is not None:  # arguments first (RunPlan checks it again, for every caller)
        run_folder_name(args.run_name)
    check_output_dir(args.output_dir, model=args.model, data_dir=args.data_dir)
    spec = resolve(args.model, backend=args.backend, model_id=args.model_id)
    refuse_unread_options(args, spec.backend)
    check_model_folder(spec)
    sampling = sampling_for(spec, args)
    chat_kwargs, note = chat_kwargs_for(spec, args)
    if note and dist.is_main:
        print(f"note: {note}", file=sys.stderr)
    # arguments first: a wrong one fails before the bundle's images are checked
    options = backend_class(spec.backend).Options.from_args(args)
    backend = make_backend(spec, options, sampling, chat_kwargs, args.on_error)
    sampling = backend.sampling()
    batch_size = backend.default_batch_size if args.batch_size is None else args.batch_size
    COUNT.require(batch_size, "--batch-size")
    check_release_dir(args.data_dir)  # a wrong --data-dir fails before any download
    # Hub: the weights are resolved and checked (gated, missing, disk space), then fetched once per
    # machine, before the bundle's images are read and before any engine starts; the backend then
    # loads that snapshot folder
    load, weights = prepare_model(spec, args.revision, dist, remote_code=runs_remote_code(backend))
    if load is not spec:
        backend = make_backend(load, options, sampling, chat_kwargs, args.on_error)
    bundle, cases, selection = _selected(args, dist)
    oracles = oracles_of(args, sampling)
    e2e = end_to_end_note(
        spec.name, greedy=sampling.greedy, temperature=sampling.temperature, settings=oracles
    )
    if e2e and dist.is_main:  # said before anything is spent
        print(f"note: {e2e}", file=sys.stderr)
    plan = RunPlan(
        model=spec,
        load=load,
        options=options,
        sampling=sampling,
        chat_kwargs=chat_kwargs,
        batch_size=batch_size,
        bundle=bundle,
        cases=tuple(cases),
        selection=selection,
        oracles=oracles,
        parse_mode=args.parse_mode,
        on_error=args.on_error,
        seed=seed_for(spec, args),
        weights=weights.record() if weights is not None else None,
        output_dir=FsPath(args.output_dir),
        run_name=args.run_name,
        progress=progress_enabled(args),
        score=not args.no_score,
        command=tuple(sys.argv),
        notes=(note,) if note else (),
    )
    return plan, backend


def _selected(args: argparse.Namespace, dist: Distributed) -> tuple[Bundle, list[Case], Selection]:
    """The bundle (images checked), the selected cases and the selection as recorded; a note (main
    process) for an option that selects no less than is there (``selection_notes``)."""
    lesions, paths = split_list(args.lesions), split_list(args.paths)
    bundle = read_bundle(args.data_dir, lesions=lesions, paths=paths, check_images=args.check_images)
    cases = select_cases(bundle.cases, per_cell=args.per_cell, limit=args.limit)
    if dist.is_main:
        for note in selection_notes(bundle.cases, per_cell=args.per_cell, limit=args.limit):
            print(f"note: {note}", file=sys.stderr)
    if not cases:
        raise ValueError(
            f"no case of {bundle.root} matches the selection (--lesions/--paths/--per-cell/--limit)"
        )
    selection = Selection(
        lesions=lesions, paths=paths, per_cell=args.per_cell, limit=args.limit, n_selected=len(cases)
    )
    return bundle, cases, selection
