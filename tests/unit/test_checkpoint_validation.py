"""A checkpoint is checked whole before it is used: the optimizer state tensor by tensor, the
GradScaler and RNG states by type and length, and the model sizes its config claims against
its stored tensors before anything is allocated.

Each crafted checkpoint carries a valid digest (`save_checkpoint` writes it), so only these
checks stand between it and `optimizer.load_state_dict`, `random.setstate` or a 37 GB model.
Expectations: the message names the entry; the model, the optimizer and the folder are left as
they were; a claimed model larger than the memory allowed is refused within that memory.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from training_fixtures import TINY_VOCAB, one_line_error, random_examples, tiny_model

from bahdanau.checkpoint import (
    average_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from bahdanau.config import ModelConfig, TrainConfig
from bahdanau.data import collate
from bahdanau.model_folder import model_skeleton
from bahdanau.models import build_model
from bahdanau.presets import tiny
from bahdanau.training import make_optimizer, save_run, setup_run, train_run, train_step
from bahdanau.training.state import (
    TrainState,
    check_rng_state,
    checkpoint_payload,
    restore,
    rng_state,
    set_rng_state,
)

VOCAB = TINY_VOCAB
EXAMPLES = random_examples(16)
ROOT = Path(__file__).resolve().parents[2]


def _payload(optimizer: str = "adam", amsgrad: bool = False) -> dict[str, Any]:
    """A checkpoint of one update of a tiny model (parameter 0 is the source embedding)."""
    model = tiny_model(1)
    opt = make_optimizer(model, TrainConfig(optimizer=optimizer))
    if amsgrad:
        opt.param_groups[0]["amsgrad"] = True
    train_step(model, collate(EXAMPLES[:4]), opt)
    scaler = torch.amp.GradScaler("cpu")
    return checkpoint_payload(model, src_vocab=VOCAB, tgt_vocab=VOCAB, optimizer=opt,
                              scaler=scaler, train_config=TrainConfig(optimizer=optimizer),
                              train_state=TrainState(step=1, position=1))


def _state(key: str, value: Any, index: int = 0) -> Callable[[dict], None]:
    def change(p: dict) -> None:
        p["optimizer"]["state"][index][key] = value
    return change


def _group(key: str, value: Any) -> Callable[[dict], None]:
    def change(p: dict) -> None:
        p["optimizer"]["param_groups"][0][key] = value
    return change


def _entry(section: str, *path: Any, value: Any) -> Callable[[dict], None]:
    def change(p: dict) -> None:
        target = p[section]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


def _delete_state_entry(p: dict) -> None:
    del p["optimizer"]["state"][3]["exp_avg_sq"]


def _all_nan_moments(p: dict) -> None:
    for entry in p["optimizer"]["state"].values():
        entry["exp_avg"].fill_(float("nan"))
        entry["exp_avg_sq"].fill_(float("nan"))


def _python_words(n: int, position: int = 624) -> torch.Tensor:
    return torch.tensor([5] * (n - 1) + [position], dtype=torch.int64)


EMBED = "(16, 8)"
STATE = "checkpoint optimizer state[0]"
# (name, change to a good Adam payload, what the one-line message must say)
CRAFTED = [
    ("exp_avg of another shape (the issue's abort)", _state("exp_avg", torch.zeros(16, 9)),
     f"{STATE}['exp_avg'] is torch.float32 (16, 9), its parameter torch.float32 {EMBED}"),
    ("exp_avg of another dtype", _state("exp_avg_sq", torch.zeros(16, 8, dtype=torch.float64)),
     f"{STATE}['exp_avg_sq'] is torch.float64 {EMBED}, its parameter torch.float32 {EMBED}"),
    ("exp_avg of fewer elements", _state("exp_avg", torch.zeros(4), index=5),
     "checkpoint optimizer state[5]['exp_avg'] is torch.float32 (4,)"),
    ("exp_avg not a tensor", _state("exp_avg", [0.0] * 8),
     f"{STATE}['exp_avg'] is a list, not a tensor"),
    ("a moment missing", _delete_state_entry,
     "checkpoint optimizer state[3] has the entries ['exp_avg', 'step'], Adam keeps"),
    ("an unknown entry", _state("momentum_buffer", torch.zeros(16, 8)),
     f"{STATE} has the entries ['exp_avg', 'exp_avg_sq', 'momentum_buffer', 'step']"),
    ("step a string", _state("step", "1"),
     f"{STATE}['step'] must be a number or a one-element tensor, got str '1'"),
    ("step negative", _state("step", torch.tensor(-3.0)),
     f"{STATE}['step'] must be a finite number >= 0, got -3.0"),
    ("step nan", _state("step", torch.tensor(float("nan"))),
     f"{STATE}['step'] must be a finite number >= 0, got nan"),
    ("a NaN moment", _state("exp_avg_sq", torch.full((16, 8), float("nan"))),
     f"{STATE}['exp_avg_sq'] holds NaN or inf"),
    ("all-NaN Adam state (the issue's silent one)", _all_nan_moments,
     f"{STATE}['exp_avg'] holds NaN or inf"),
    ("an inf moment", _state("exp_avg", torch.full((16, 8), float("inf"))),
     f"{STATE}['exp_avg'] holds NaN or inf"),
    ("state of no parameter", _entry("optimizer", "state", 99, value={}),
     "checkpoint optimizer state[99] is of no parameter of its param_groups"),
    ("state entry not a dict", _entry("optimizer", "state", 2, value=[1]),
     "checkpoint optimizer state[2] is a list, not a dict"),
    ("duplicate parameter ids", _group("params", [0] * 26),
     "checkpoint optimizer param_groups must list distinct int ids"),
    ("betas a string", _group("betas", "ab"),
     "checkpoint optimizer param_groups[0]['betas'] must be like (0.9, 0.999), got str 'ab'"),
    ("betas too short", _group("betas", (0.9,)),
     "checkpoint optimizer param_groups[0]['betas'] must be like (0.9, 0.999)"),
    ("weight_decay missing", lambda p: p["optimizer"]["param_groups"][0].pop("weight_decay"),
     "checkpoint optimizer param_groups[0]['weight_decay'] is missing"),
    ("amsgrad a number", _group("amsgrad", 1),
     "checkpoint optimizer param_groups[0]['amsgrad'] must be like False, got int 1"),
    ("scaler without its tracker", lambda p: p["scaler"].pop("_growth_tracker"),
     "checkpoint scaler must hold ['_growth_tracker', 'backoff_factor', 'growth_factor', "
     "'growth_interval', 'scale'], got ['backoff_factor'"),
    ("scaler scale negative", _entry("scaler", "scale", value=-1.0),
     "checkpoint scaler['scale'] must be a finite number > 0, got float -1.0"),
    ("scaler tracker a float", _entry("scaler", "_growth_tracker", value=0.5),
     "checkpoint scaler['_growth_tracker'] must be an int, got float 0.5"),
    ("python RNG of 624 words (the issue's traceback)",
     _entry("rng", "python", "state", value=_python_words(624)),
     "checkpoint rng['python']['state'] must be a torch.int64 tensor of shape (625,), got "
     "torch.int64 (624,)"),
    ("python RNG of 626 words", _entry("rng", "python", "state", value=_python_words(626)),
     "checkpoint rng['python']['state'] must be a torch.int64 tensor of shape (625,)"),
    ("python RNG position past the end",
     _entry("rng", "python", "state", value=_python_words(625, position=700)),
     "checkpoint rng['python']['state'] ends with the position 700, which must be <= 624"),
    ("python RNG word of 33 bits",
     _entry("rng", "python", "state", value=torch.full((625,), 2**32, dtype=torch.int64)),
     "checkpoint rng['python']['state'] holds values outside [0, 4294967296)"),
    ("python RNG gauss a string", _entry("rng", "python", "gauss", value="x"),
     "checkpoint rng['python'] must be {'version': 3, 'state': ..., 'gauss': None or a number}"),
    ("python RNG a tuple", _entry("rng", "python", value=(3, (), None)),
     "checkpoint rng['python'] must be {'version': 3,"),
    ("numpy RNG position 700", _entry("rng", "numpy", "pos", value=700),
     "checkpoint rng['numpy'] must be {'kind': 'MT19937', 'keys', 'pos' in [0, 624]"),
    ("numpy RNG keys short", _entry("rng", "numpy", "keys",
                                    value=torch.zeros(623, dtype=torch.int64)),
     "checkpoint rng['numpy']['keys'] must be a torch.int64 tensor of shape (624,)"),
    ("numpy RNG of another kind", _entry("rng", "numpy", "kind", value="PCG64"),
     "checkpoint rng['numpy'] must be {'kind': 'MT19937'"),
    ("torch RNG short", _entry("rng", "torch", value=torch.zeros(100, dtype=torch.uint8)),
     "checkpoint rng['torch'] must be a torch.uint8 tensor of shape (5056,), got torch.uint8 "
     "(100,)"),
    ("torch RNG of int64", _entry("rng", "torch", value=torch.zeros(5056, dtype=torch.int64)),
     "checkpoint rng['torch'] must be a torch.uint8 tensor of shape (5056,), got torch.int64"),
    ("torch RNG that torch refuses", _entry("rng", "torch",
                                            value=torch.zeros(5056, dtype=torch.uint8)),
     "checkpoint rng['torch'] is not a torch generator state"),
    ("cuda RNG not a list", _entry("rng", "cuda", value=torch.zeros(16, dtype=torch.uint8)),
     "checkpoint rng['cuda'] must be a list of uint8 tensors, one per device"),
    ("rng without numpy", lambda p: p["rng"].pop("numpy"),
     "checkpoint rng must hold the states of 'torch', 'python', 'numpy' (and 'cuda')"),
    ("rng_by_rank not a list", lambda p: p.update(rng_by_rank={"0": p["rng"]}),
     "checkpoint rng_by_rank must be a list, one entry per process"),
    ("rng_by_rank entry malformed", lambda p: p.update(rng_by_rank=[{"torch": 1}]),
     "checkpoint rng_by_rank[0] must hold the states of 'torch', 'python', 'numpy'"),
]


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict, str]:
    return {k: v.clone() for k, v in model.state_dict().items()}, str(opt.state_dict())


@pytest.mark.parametrize(("change", "expected"), [c[1:] for c in CRAFTED],
                         ids=[c[0] for c in CRAFTED])
def test_crafted_state_is_refused_in_one_line_before_anything_changes(
        tmp_path, change: Callable[[dict], None], expected: str) -> None:
    payload = _payload()
    change(payload)
    path = tmp_path / "step_00000001.pt"
    save_checkpoint(path, payload)                  # a valid digest: the checks must see it
    # restore() into live objects: nothing of them changes, the RNGs neither
    model = tiny_model(2)
    opt = make_optimizer(model, TrainConfig(optimizer="adam"))
    scaler = torch.amp.GradScaler("cpu")
    train_step(model, collate(EXAMPLES[4:8]), opt)
    before, rng = _snapshot(model, opt), torch.get_rng_state()
    message = one_line_error(lambda: restore(load_checkpoint(path), model, opt, scaler=scaler,
                                             src_vocab=VOCAB, tgt_vocab=VOCAB), expected)
    assert message.startswith("checkpoint ")
    after = _snapshot(model, opt)
    assert after[1] == before[1]
    assert all(torch.equal(after[0][k], v) for k, v in before[0].items())
    assert torch.equal(torch.get_rng_state(), rng)
    # resuming a run from the folder: the file is named first, nothing is written
    files = sorted(os.listdir(tmp_path))
    cfg = TrainConfig(optimizer="adam", max_steps=3, amp="fp16")
    message = one_line_error(lambda: setup_run(tiny_model(3), EXAMPLES, cfg, src_vocab=VOCAB,
                                               tgt_vocab=VOCAB, checkpoint_dir=tmp_path),
                             expected)
    assert message.startswith(f"{path}: ")
    assert sorted(os.listdir(tmp_path)) == files


@pytest.mark.parametrize(("optimizer", "amsgrad"), [("adam", False), ("adam", True),
                                                    ("adadelta", False)])
def test_good_optimizer_states_restore_whole(optimizer: str, amsgrad: bool) -> None:
    """The checks accept what the optimizers store (Adam with amsgrad keeps a 4th entry)."""
    payload = _payload(optimizer, amsgrad)
    model = tiny_model(2)
    opt = make_optimizer(model, TrainConfig(optimizer=optimizer))
    restore(payload, model, opt, scaler=torch.amp.GradScaler("cpu"))
    assert str(opt.state_dict()["state"]) == str(payload["optimizer"]["state"])


def test_adadelta_moment_of_another_shape_is_refused() -> None:
    payload = _payload("adadelta")
    payload["optimizer"]["state"][1]["acc_delta"] = torch.zeros(3)
    model = tiny_model(2)
    one_line_error(lambda: restore(payload, model, make_optimizer(model, TrainConfig())),
                   "checkpoint optimizer state[1]['acc_delta'] is torch.float32 (3,), its "
                   "parameter torch.float32")


def test_another_optimizer_class_is_only_checked_finite() -> None:
    """An optimizer of the caller's own (here SGD with momentum) has entries the checks do not
    know: its tensors must be finite, nothing more."""
    model = tiny_model(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_step(model, collate(EXAMPLES[:4]), opt)
    payload = checkpoint_payload(model, src_vocab=VOCAB, tgt_vocab=VOCAB, optimizer=opt)
    target = tiny_model(2)
    restore(copy.deepcopy(payload), target, torch.optim.SGD(target.parameters(), lr=0.1,
                                                            momentum=0.9))
    payload["optimizer"]["state"][0]["momentum_buffer"][0, 0] = float("nan")
    one_line_error(lambda: restore(payload, target, torch.optim.SGD(
        target.parameters(), lr=0.1, momentum=0.9)),
        "checkpoint optimizer state[0]['momentum_buffer'] holds NaN or inf")


# ----------------------------------------------------------------------------------------------
# Model sizes: checked against the stored tensors before the model is built


CONFIGS = [dataclasses.replace(tiny(), arch=arch, attention=attention, gru_form=form,
                               init=init, engine=engine)
           for arch, attention, form, init, engine in (
               ("rnnsearch", "additive", "torch", "paper", "fast"),
               ("rnnsearch", "luong_general", "paper", "glorot", "reference"),
               ("rnnsearch", "luong_general", "torch", "glorot", "fast"),
               ("rnnencdec", "additive", "paper", "paper", "fast"))]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.arch}-{c.attention}-{c.gru_form}")
def test_skeleton_has_the_models_shapes_on_the_meta_device(config: ModelConfig) -> None:
    skeleton = model_skeleton(lambda: build_model(config))
    real = build_model(config)
    assert {k: v.shape for k, v in skeleton.state_dict().items()} == {
        k: v.shape for k, v in real.state_dict().items()}
    assert {v.device.type for v in skeleton.state_dict().values()} == {"meta"}


def _claiming(path: Path, **sizes: int) -> Path:
    """A small checkpoint whose model_config claims `sizes` (its digest valid)."""
    payload = _payload()
    payload["model_config"] = {**payload["model_config"], **sizes}
    save_checkpoint(path, payload)
    return path


# Loads the checkpoint (as translation, averaging and train --init-from read it) in a process
# that may use 3 GiB at most: a model built from the claim would need more (checked below), so
# only a refusal made before building it gets through.
_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
from bahdanau.errors import InputError
from bahdanau.checkpoint import average_checkpoints, model_from_checkpoint
from bahdanau.jobs.init_from import read_init_model
for load in (model_from_checkpoint, lambda p: average_checkpoints([p]), read_init_model):
    try:
        load(sys.argv[1])
    except InputError as err:
        print(err)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is Linux's")
def test_claimed_sizes_are_refused_before_any_allocation(tmp_path) -> None:
    claimed = dataclasses.replace(tiny(), embed_size=10**7)
    skeleton = model_skeleton(lambda: build_model(claimed))
    needed = sum(p.numel() * p.element_size() for p in skeleton.parameters())
    assert needed > 4 * 2**30                           # what building it would allocate
    path = _claiming(tmp_path / "claims.pt", embed_size=10**7)
    assert path.stat().st_size < 2**20
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", _LIMITED, str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = ("weights do not fit the model: 'encoder.embedding.weight' has shape (16, 8), "
                "the model's has (16, 10000000)")
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(expected in line for line in lines), done.stdout


@pytest.mark.parametrize("sizes", [{"hidden_size": 9}, {"align_size": 11}, {"maxout_size": 4}])
def test_any_claimed_size_is_checked(tmp_path, sizes: dict[str, int]) -> None:
    path = _claiming(tmp_path / "claims.pt", **sizes)
    message = one_line_error(lambda: model_from_checkpoint(path), "weights do not fit the model")
    assert message.startswith(f"{path}: ")
    one_line_error(lambda: average_checkpoints([path]), "weights do not fit the model")


# ----------------------------------------------------------------------------------------------
# RNG states by rank: each process resumes its own; another process count is said in one line


def _two_process_checkpoint(directory: Path) -> tuple[Path, list[torch.Tensor]]:
    """A one-process run's checkpoint rewritten as a two-process run's would be: processes 2,
    and two different RNG states by rank. Returns the file and each rank's torch state."""
    cfg = TrainConfig(batch_size=4, bucket=1, max_steps=4)
    run = setup_run(tiny_model(), EXAMPLES, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                    checkpoint_dir=directory)
    path = save_run(run)
    assert path is not None
    payload = load_checkpoint(path)
    assert "rng_by_rank" not in payload                       # one process: `rng` alone
    other = copy.deepcopy(payload["rng"])
    torch.manual_seed(99)
    other["torch"] = torch.get_rng_state()
    payload["rng_by_rank"] = [payload["rng"], other]
    payload["train_state"]["processes"] = 2
    save_checkpoint(path, payload)
    return path, [payload["rng"]["torch"], other["torch"]]


def test_each_rank_restores_the_rng_state_it_saved(tmp_path) -> None:
    path, streams = _two_process_checkpoint(tmp_path)
    for rank in (0, 1):
        restore(load_checkpoint(path), tiny_model(), rank=rank)
        assert torch.equal(torch.get_rng_state(), streams[rank])
    restore(load_checkpoint(path), tiny_model(), rank=2)       # none of its own: rank 0's
    assert torch.equal(torch.get_rng_state(), streams[0])


def _fake_gpus(monkeypatch, count: int, current: int) -> list[tuple[int, int]]:
    """CUDA with `count` devices, `current` the process's, for the RNG code: each generator
    state is 16 bytes (a Philox seed and offset); returns the (device, first byte) of each
    state set."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "get_rng_state",
                        lambda device="cuda": torch.zeros(16, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state",
                        lambda state, device: calls.append((device, int(state[0]))))
    return calls


def test_cuda_rng_states_are_checked_by_length_where_cuda_is_available(monkeypatch) -> None:
    state = rng_state()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8), torch.zeros(3, dtype=torch.uint8)]
    if not torch.cuda.is_available():
        check_rng_state(state)                  # without CUDA they are not restored: ignored
    _fake_gpus(monkeypatch, count=2, current=0)
    one_line_error(lambda: check_rng_state(state, "rng_by_rank[1]"),
                   "checkpoint rng_by_rank[1]['cuda'][1] holds 3 bytes; a CUDA generator state "
                   "holds 16")
    state["cuda"][1] = torch.ones(16, dtype=torch.uint8)
    check_rng_state(state)


def test_each_rank_restores_its_own_gpu_s_cuda_rng_state_only(tmp_path, monkeypatch) -> None:
    """A process of a several-process run sets the CUDA state of its GPU alone (another GPU's
    would start a CUDA context there); one process resuming rank 0's states sets them all."""
    path, _ = _two_process_checkpoint(tmp_path)
    payload = load_checkpoint(path)
    for states in payload["rng_by_rank"]:
        states["cuda"] = [torch.full((16,), device, dtype=torch.uint8) for device in range(4)]
    payload["rng"] = payload["rng_by_rank"][0]
    calls = _fake_gpus(monkeypatch, count=4, current=2)
    for rank in (0, 1):
        restore(payload, tiny_model(), rank=rank)
        assert calls == [(2, 2)], rank
        calls.clear()
    restore(payload, tiny_model(), rank=2)      # none of its own: rank 0's, every device
    assert calls == [(0, 0), (1, 1), (2, 2), (3, 3)]
    calls.clear()
    set_rng_state(payload["rng"])
    assert calls == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_resume_with_another_process_count_says_the_streams_change(tmp_path) -> None:
    _two_process_checkpoint(tmp_path)
    cfg = TrainConfig(batch_size=4, bucket=1, max_steps=5, accumulation=2)
    run = setup_run(tiny_model(), EXAMPLES, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                    checkpoint_dir=tmp_path)
    assert run.resume_notes == [
        "the checkpoint holds the random states of 2 processes, this run has 1: the dropout "
        "streams (every random draw) change from those of an uninterrupted run"]
    lines: list[str] = []
    train_run(run, log=lines.append)
    assert f"on resume: {run.resume_notes[0]}" in lines
    # the same process count says nothing
    cfg = TrainConfig(batch_size=4, bucket=1, max_steps=6, accumulation=2)
    rerun = setup_run(tiny_model(), EXAMPLES, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                      checkpoint_dir=tmp_path)
    assert rerun.resume_notes == []
