"""Options resolved once, before any work: the device and threads, the precision, the search, the
checkpoints.

`machine` checks --device and sets --threads, and `thread_tuner` (`decoding_threads` for the
decoding commands) follows the machine's load when --threads is not given; `autocast` turns
--amp into the `torch.autocast` the model runs under; `beam_search` builds the `BeamSearch` of
the search options; `checkpoint_paths` finds the --checkpoint files and `load_decoder` loads
their model (the ensemble of several), vocabularies and tokenizer; `phrase_files` reads
--constraints and --avoid, and `check_line_phrases` checks them against the input's lines and
the model.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bahdanau._checks import cpu_threads, default_device, launcher_value, resolve_device
from bahdanau._files import repeated_file
from bahdanau.checkpoint.reader import find_checkpoint
from bahdanau.errors import InputError
from bahdanau.jobs.files import existing, read_phrases
from bahdanau.jobs.options import (
    DecodeOptions,
    PhraseOptions,
    ScoreOptions,
    SearchOptions,
    TrainOptions,
)
from bahdanau.phrases import check_constraints
from bahdanau.search import CAPTURED_CHECK_EVERY, BeamSearch
from bahdanau.training.precision import AMP_DTYPES, precision_line, resolve_amp
from bahdanau.training.run import check_machine
from bahdanau.training.threads import AdaptiveThreads
from bahdanau.translate import Translator, load

_LOG = logging.getLogger(__name__)


def machine(o: TrainOptions | DecodeOptions | ScoreOptions) -> torch.device:
    """Check --device (auto: cuda when available, else cpu), and --cuda-graphs and --int8 with
    it, and set --threads (default: OMP_NUM_THREADS, else the usable cores divided by
    LOCAL_WORLD_SIZE: `bahdanau._checks.default_threads`; more than the usable cores is
    refused: `bahdanau._checks.cpu_threads`); returns the device. Under
    torchrun, cuda is each process's own GPU, cuda:LOCAL_RANK."""
    device = resolve_device(default_device() if o.device == "auto" else o.device, "--device")
    if launcher_value("WORLD_SIZE") > 1 and device.type == "cuda":
        if device.index is not None:
            raise InputError(f"--device {o.device}: under torchrun each process trains on "
                             "cuda:LOCAL_RANK; give --device cuda (or auto)")
        device = resolve_device(f"cuda:{launcher_value('LOCAL_RANK')}", "cuda:LOCAL_RANK")
        torch.cuda.set_device(device)
    if isinstance(o, TrainOptions):          # what the run asks of the machine: --cuda-graphs
        check_machine(o.training, device, launcher_value("WORLD_SIZE"))
    elif isinstance(o, DecodeOptions) and o.cuda_graphs and device.type != "cuda":
        raise InputError(f"--cuda-graphs replays decoder steps as CUDA graphs, which needs a "
                         f"CUDA device, not {device}")
    elif isinstance(o, DecodeOptions) and o.int8 and device.type != "cpu":
        raise InputError(f"--int8 decodes on a CPU's int8 units, not on {device}: give "
                         "--device cpu")
    if isinstance(o, DecodeOptions) and o.int8 and resolve_amp(o.amp, device)[0] != "none":
        raise InputError(f"--int8 decodes the big matmuls in int8 and the rest in float32; it "
                         f"does not combine with --amp {o.amp}")
    torch.set_num_threads(cpu_threads(o.threads))
    _LOG.debug(f"device {device}, {torch.get_num_threads()} CPU threads")
    return device


def autocast(amp: str, device: torch.device
             ) -> AbstractContextManager[Any]:
    """The context a model runs under in the precision `amp` names ("none", "bf16", "fp16", or
    "auto" as `bahdanau.training.precision.resolve_amp` resolves it: `bahdanau.config.Amp`) on
    `device`: `torch.autocast` in bfloat16 or float16, or for "none"
    a context that changes nothing. Built once, before any work; enter it around the model's
    calls (a search, a loss), as many times as needed, one at a time.

    Raises:
        InputError: torch cannot autocast to that dtype on that device (bfloat16 on a GPU without
            it, or a device or dtype torch's autocast would switch off with a warning), one
            line naming --amp.
    """
    amp = resolve_amp(amp, device)[0]             # "auto": what it picks here, else amp
    dtype = AMP_DTYPES[amp]
    if dtype is None:
        return nullcontext()
    name = str(dtype).removeprefix("torch.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            context = torch.autocast(device.type, dtype=dtype)
        except RuntimeError as err:              # a GPU without bfloat16, a device without it
            reason = " ".join(str(err).split())
            raise InputError(f"--amp {amp}: torch cannot autocast to {name} on {device}: "
                             f"{reason}") from None
    if caught:                                   # torch would switch autocast off
        reason = " ".join(str(caught[0].message).split())
        raise InputError(f"--amp {amp}: torch cannot autocast to {name} on {device}: {reason}")
    return context


def thread_tuner(o: TrainOptions | DecodeOptions, device: torch.device
                 ) -> AdaptiveThreads | None:
    """The `AdaptiveThreads` of a run on the CPU whose --threads is not given, which follows
    the machine's load up to the default count: a training run's observes its updates and
    starts at that count, a decoding command's (`AdaptiveThreads.for_decoding`) observes its
    search steps (`beam_search`) and starts at one thread. None with --threads, on a GPU,
    under torchrun (its processes share the cores, LOCAL_WORLD_SIZE each) or on one core."""
    most = torch.get_num_threads()
    if (o.threads is not None or device.type != "cpu" or launcher_value("WORLD_SIZE") > 1
            or most == 1):
        return None
    if isinstance(o, TrainOptions):
        return AdaptiveThreads(most)
    return AdaptiveThreads.for_decoding(most, log=_LOG.debug)


def decoding_threads(o: DecodeOptions, device: torch.device) -> AdaptiveThreads | None:
    """A decoding command's `thread_tuner`, its choice logged (with --verbose) as the
    `machine_line`; its changes are logged there too."""
    tuner = thread_tuner(o, device)
    _LOG.debug(machine_line(device, tuner, o.amp))
    return tuner


def machine_line(device: torch.device, tuner: AdaptiveThreads | None, amp: str) -> str:
    """The first line of a training log (and of a decoding command's, with --verbose): the
    device, the CPU threads and how they were chosen, and the precision --amp `amp` runs in
    there and why (`bahdanau.training.precision.precision_line`)."""
    precision = precision_line(amp, device)
    if device.type != "cpu":
        return f"machine: {device} ({torch.cuda.get_device_name(device)}); {precision}"
    if tuner is None:
        n = torch.get_num_threads()
        return f"machine: cpu, {n} thread{'s' if n != 1 else ''}; {precision}"
    most = f" (up to {tuner.most})" if tuner.start < tuner.most else ""
    return (f"machine: cpu, {tuner.start} thread{'s' if tuner.start != 1 else ''} at first, "
            f"then as many as measure fastest{most} beside the machine's other work "
            f"(--threads N fixes the count); {precision}")


def beam_search(o: SearchOptions, n_best: int = 1,
                threads: AdaptiveThreads | None = None) -> BeamSearch:
    """The `BeamSearch` of the search options, keeping `n_best` hypotheses per sentence; with
    --cuda-graphs (a decoding command's, or a training run's for its dev and test decoding) its
    steps replay as CUDA graphs, the host looking at the batch every `CAPTURED_CHECK_EVERY`;
    with `threads` (`decoding_threads`), its steps set torch's CPU threads as they go."""
    graphs = (o.training.cuda_graphs if isinstance(o, TrainOptions)
              else isinstance(o, DecodeOptions) and o.cuda_graphs)
    return captured(BeamSearch(beam_size=o.beam_size, n_best=n_best, max_len=o.max_len,
                               max_len_ratio=o.max_len_ratio, min_len=o.min_len,
                               length_penalty=o.length_penalty, alpha=o.alpha,
                               observe=None if threads is None else threads.observe), graphs)


def captured(search: BeamSearch, graphs: bool) -> BeamSearch:
    """`search` with its decoder steps replayed as CUDA graphs when `graphs`, the host looking
    at the batch every `CAPTURED_CHECK_EVERY` steps; else `search` itself."""
    if not graphs:
        return search
    return replace(search, cuda_graphs=True, check_every=CAPTURED_CHECK_EVERY)


def checkpoint_paths(o: DecodeOptions) -> dict[str, Path]:
    """The --checkpoint files (each a file, or a folder's best or latest), named for
    `check_outputs`: "--checkpoint", or "--checkpoint FILE" for each of several."""
    assert o.checkpoint is not None   # required: DecodeOptions refuses None when it is built
    paths = [find_checkpoint(p, "--checkpoint") for p in o.checkpoint]
    twice = repeated_file(paths)
    if twice is not None:
        raise InputError(f"--checkpoint {twice[0]} is listed twice (also as {twice[1]}): an "
                         "ensemble holds each model once")
    if len(paths) == 1:
        return {"--checkpoint": paths[0]}
    return {f"--checkpoint {p}": p for p in paths}


def load_decoder(o: DecodeOptions, paths: dict[str, Path], device: torch.device) -> Translator:
    """The checkpoint's model (the ensemble of several; with --int8, their int8 copies),
    vocabularies, the tokenizer it was trained with and each checkpoint's step
    (`bahdanau.translate.Translator`)."""
    files = list(paths.values())
    t = load(files[0] if len(files) == 1 else files, device=device, trust_code=o.trust_code,
             int8=o.int8)
    if o.unk_replace and t.model.arch == "rnnencdec":
        what = "is an RNNencdec model" if len(files) == 1 else "are RNNencdec models"
        raise InputError(f"--unk-replace needs attention weights; {' '.join(map(str, files))} "
                         f"{what}")
    return t


# Each input line's phrases (text), or None where the option is not given
PhraseLists = tuple[list[list[str]] | None, list[list[str]] | None]


def phrase_files(o: PhraseOptions) -> PhraseLists:
    """--constraints and --avoid, read (`bahdanau.jobs.files.read_phrases`) before the model
    loads."""
    def read(path: str | None, flag: str) -> list[list[str]] | None:
        return None if path is None else read_phrases(existing(path, flag), flag)

    return read(o.constraints, "--constraints"), read(o.avoid, "--avoid")


def check_line_phrases(o: PhraseOptions, phrases: PhraseLists, sources: list[str],
                       t: Translator, search: BeamSearch) -> None:
    """Refuse, before any line is translated, phrases of `phrase_files` that do not fit the
    input: a file of another number of lines, phrases for an empty input line (its translation
    is an empty line), and what `bahdanau.phrases.check_constraints` refuses, naming the file
    and the line."""
    for (flag, path), lists in zip((("--constraints", o.constraints), ("--avoid", o.avoid)),
                                   phrases, strict=True):
        if lists is None:
            continue
        if len(lists) != len(sources):
            raise InputError(f"{flag} {path} has {len(lists)} lines but the input has "
                             f"{len(sources)}: give one list of phrases per input line ([] "
                             "for none)")
        blank = next((i for i, (line, p) in enumerate(zip(sources, lists, strict=True))
                      if p and not line.strip()), None)
        if blank is not None:
            raise InputError(f"{flag} {path}: line {blank + 1} has phrases, but input line "
                             f"{blank + 1} is empty (its translation is an empty line)")
    check_constraints([len(t.tokenizer.tokenize(line)) for line in sources], *phrases,
                      t.tgt_vocab, t.tokenizer, search,
                      names=(f"--constraints {o.constraints}", f"--avoid {o.avoid}"),
                      label=lambda i: f"line {i + 1}")
