"""Options resolved once, before any work: the device and threads, the search, the checkpoints.

`machine` checks --device and sets --threads; `beam_search` builds the `BeamSearch` of the search
options; `checkpoint_paths` finds the --checkpoint files and `load_decoder` loads their model
(the ensemble of several), vocabularies and tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bahdanau._checks import default_device, default_threads, launcher_value, resolve_device
from bahdanau._files import repeated_file
from bahdanau.checkpoint.manager import find_checkpoint
from bahdanau.data.tokenizers import Tokenizer
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.jobs.options import DecodeOptions, ScoreOptions, SearchOptions, TrainOptions
from bahdanau.search import BeamSearch
from bahdanau.translate import load


def machine(o: TrainOptions | DecodeOptions | ScoreOptions) -> torch.device:
    """Check --device (auto: cuda when available, else cpu) and set --threads (default: the
    usable cores divided by LOCAL_WORLD_SIZE); returns the device. Under torchrun, cuda is
    each process's own GPU, cuda:LOCAL_RANK."""
    device = resolve_device(default_device() if o.device == "auto" else o.device, "--device")
    if launcher_value("WORLD_SIZE") > 1 and device.type == "cuda":
        if device.index is not None:
            raise InputError(f"--device {o.device}: under torchrun each process trains on "
                             "cuda:LOCAL_RANK; give --device cuda (or auto)")
        device = resolve_device(f"cuda:{launcher_value('LOCAL_RANK')}", "cuda:LOCAL_RANK")
        torch.cuda.set_device(device)
    torch.set_num_threads(o.threads or default_threads())
    return device


def beam_search(o: SearchOptions, n_best: int = 1) -> BeamSearch:
    """The `BeamSearch` of the search options, keeping `n_best` hypotheses per sentence."""
    return BeamSearch(beam_size=o.beam_size, n_best=n_best, max_len=o.max_len,
                      max_len_ratio=o.max_len_ratio, min_len=o.min_len,
                      length_penalty=o.length_penalty, alpha=o.alpha)


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


def load_decoder(o: DecodeOptions, paths: dict[str, Path], device: torch.device
          ) -> tuple[torch.nn.Module, Vocab, Vocab, Tokenizer]:
    """The checkpoint's model (the ensemble of several), vocabularies and the tokenizer it was
    trained with."""
    files = list(paths.values())
    t = load(files[0] if len(files) == 1 else files, device=device)
    if o.unk_replace and t.model.arch == "rnnencdec":
        what = "is an RNNencdec model" if len(files) == 1 else "are RNNencdec models"
        raise InputError(f"--unk-replace needs attention weights; {' '.join(map(str, files))} "
                         f"{what}")
    return t.model, t.src_vocab, t.tgt_vocab, t.tokenizer
