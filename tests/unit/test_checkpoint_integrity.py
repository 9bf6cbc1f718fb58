"""Checkpoint integrity: the digest, malformed checkpoints, best.json, and crashes while saving.

Expectations come from the documented format (the digest walk is written out by hand), from
the payload that was saved (a refused file must say which entry is wrong), and from an
uninterrupted reference run (what a checkpoint claims to hold after a crash).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import struct
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from training_fixtures import TINY_VOCAB, random_examples, tiny_model

from bahdanau.checkpoint import (
    CheckpointManager,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from bahdanau.config import TrainConfig
from bahdanau.data import collate
from bahdanau.errors import InputError
from bahdanau.training import (
    TrainRun,
    make_optimizer,
    run_step,
    save_run,
    setup_run,
    train_step,
    validate_run,
)
from bahdanau.training.state import TrainState, checkpoint_payload, restore

VOCAB = TINY_VOCAB
DAMAGED = "damaged checkpoint: its contents do not match the digest stored in it"
CFG = TrainConfig(batch_size=4, bucket=1, max_steps=100, keep_last=2, log_every=100,
                  save_every=100)
# Step 1 is the first best, 2 no improvement, 3 a new best that also deletes step 1, 4 deletes
# step 2: every write of the save sequence happens in one of these saves.
METRICS: dict[int, float | None] = {1: 1.0, 2: 0.5, 3: 2.0, 4: None}


EXAMPLES = random_examples(16)


def _same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _one_line_error(call: Callable[[], Any]) -> str:
    """The message of the InputError that `call` raises; it must be one line."""
    with pytest.raises(InputError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    return message


def _data_offset(path: Path, suffix: str) -> tuple[int, int]:
    """(offset, size) of the stored bytes of the zip entry ending in `suffix` (torch.save
    stores entries uncompressed)."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(suffix))
    raw = path.read_bytes()
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    assert info.compress_type == zipfile.ZIP_STORED
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------------------------
# The digest


def test_digest_is_the_documented_walk(tmp_path) -> None:
    payload = {"a": torch.tensor([1, 2], dtype=torch.int16), "b": [None, True, 1.5, "x"],
               "c": (torch.tensor(1.0, dtype=torch.bfloat16),)}
    walk = (b"dict 3\n"
            b"str 'a'\n" b"tensor torch.int16 (2,)\n" b"\x01\x00\x02\x00"
            b"str 'b'\n" b"list 4\n" b"NoneType None\n" b"bool True\n" b"float 1.5\n"
            b"str 'x'\n"
            b"str 'c'\n" b"tuple 1\n" b"tensor torch.bfloat16 ()\n" b"\x80\x3f")  # bf16 1.0
    save_checkpoint(tmp_path / "c.pt", payload)
    stored = torch.load(tmp_path / "c.pt", weights_only=True)
    assert stored["digest"] == {"algorithm": "sha256", "value": hashlib.sha256(walk).hexdigest()}
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert "digest" not in loaded and "digest" not in payload
    assert torch.equal(loaded["a"], payload["a"]) and loaded["b"] == payload["b"]
    assert torch.equal(loaded["c"][0], payload["c"][0])


def test_digest_round_trip_of_every_dtype_and_layout(tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    payload = {f"{dtype}": base.to(dtype) for dtype in (
        torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8,
        torch.uint8, torch.bool, torch.complex64)}
    payload["transposed"] = base.t()           # not contiguous
    payload["view"] = base[1:3, 2:]            # a view into a larger storage
    payload["empty"] = torch.zeros(0, 3)
    payload["scalar"] = torch.tensor(7)
    payload["size"] = torch.Size([2, 3])
    save_checkpoint(tmp_path / "c.pt", payload)
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert loaded.keys() == payload.keys()
    for key, value in payload.items():
        assert torch.equal(loaded[key], value) if isinstance(value, torch.Tensor) else (
            loaded[key] == value)


def test_save_replaces_a_stale_digest_entry(tmp_path) -> None:
    """A payload read back, changed and saved again gets the digest of what it now holds."""
    save_checkpoint(tmp_path / "c.pt", {"w": torch.ones(3), "n": 1})
    payload = load_checkpoint(tmp_path / "c.pt")
    payload["n"] = 2
    payload["digest"] = {"algorithm": "sha256", "value": "0" * 64}
    save_checkpoint(tmp_path / "c.pt", payload)
    assert load_checkpoint(tmp_path / "c.pt")["n"] == 2
    assert payload["digest"]["value"] == "0" * 64   # the caller's dict is left as it was


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flipped_byte_in_tensor_data_is_refused(tmp_path, dtype: torch.dtype) -> None:
    model = tiny_model(1)
    payload = checkpoint_payload(model.to(dtype), src_vocab=VOCAB, tgt_vocab=VOCAB,
                                 train_state=TrainState(step=1))
    path = tmp_path / "step_00000001.pt"
    save_checkpoint(path, payload)
    sizes = {k: v.numel() * v.element_size() for k, v in payload["model"].items()}
    largest = max(sizes, key=sizes.get)
    # torch.save writes the tensors' storages in payload order as data/0, data/1, ...
    index = list(payload["model"]).index(largest)
    offset, size = _data_offset(path, f"data/{index}")
    assert size == sizes[largest]
    _flip(path, offset + size // 2)
    raw = torch.load(path, weights_only=True)    # torch itself reads the damaged file
    assert not torch.equal(raw["model"][largest], payload["model"][largest])

    assert _one_line_error(lambda: load_checkpoint(path)) == f"{path}: {DAMAGED}"
    assert _one_line_error(lambda: model_from_checkpoint(path)) == f"{path}: {DAMAGED}"
    target = tiny_model(2)
    before = _snapshot(target)
    assert _one_line_error(lambda: setup_run(
        target, EXAMPLES, TrainConfig(max_steps=2), src_vocab=VOCAB, tgt_vocab=VOCAB,
        checkpoint_dir=tmp_path)) == f"{path}: {DAMAGED}"
    assert _same_tensors(_snapshot(target), before)


def test_every_flipped_bit_is_refused_or_harmless(tmp_path) -> None:
    """Flip one bit at every third byte of a small file: either the load is refused in one line
    naming the file, or every entry of the payload reads back unchanged (a bit in zip metadata
    torch does not use, or in the name of the digest entry itself)."""
    payload = {"w": torch.randn(16, generator=torch.Generator().manual_seed(0)), "n": 3,
               "s": "abc", "h": torch.ones(3, dtype=torch.bfloat16), "l": [1.5, None]}
    good = tmp_path / "good.pt"
    save_checkpoint(good, payload)
    data = good.read_bytes()
    path = tmp_path / "flipped.pt"
    outcomes = {"refused": 0, "unchanged": 0}
    for position in range(0, len(data), 3):
        path.write_bytes(data)
        _flip(path, position)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # torch warns about odd pickle protocols
                loaded = load_checkpoint(path)
        except InputError as err:
            assert str(err).startswith(f"{path}: ") and "\n" not in str(err), position
            outcomes["refused"] += 1
            continue
        for key, value in payload.items():
            same = (torch.equal(loaded[key], value) if isinstance(value, torch.Tensor)
                    else loaded[key] == value)
            assert same, (position, key)
        outcomes["unchanged"] += 1
    assert outcomes["refused"] > 0 and outcomes["unchanged"] > 0


def test_file_without_digest_still_loads(tmp_path) -> None:
    """Files of earlier versions have no digest: they load unchecked."""
    model = tiny_model(1)
    payload = checkpoint_payload(model, src_vocab=VOCAB, tgt_vocab=VOCAB)
    torch.save(payload, tmp_path / "old.pt")
    assert load_checkpoint(tmp_path / "old.pt").keys() == payload.keys()
    rebuilt, _, _ = model_from_checkpoint(tmp_path / "old.pt")
    assert _same_tensors(rebuilt.state_dict(), model.state_dict())


@pytest.mark.parametrize("entry", ["sha256:0", {"algorithm": "md5", "value": "0"},
                                   {"value": "0"}])
def test_malformed_digest_entry_is_refused(tmp_path, entry: object) -> None:
    torch.save({"w": torch.ones(2), "digest": entry}, tmp_path / "c.pt")
    message = _one_line_error(lambda: load_checkpoint(tmp_path / "c.pt"))
    assert message.startswith(f"{tmp_path / 'c.pt'}: damaged checkpoint: its digest entry is")


# ----------------------------------------------------------------------------------------------
# Malformed checkpoints: one line, the file first, nothing changed


def _payload(optimizer: str = "adadelta") -> dict[str, Any]:
    model = tiny_model(1)
    opt = make_optimizer(model, TrainConfig(optimizer=optimizer))
    train_step(model, collate(EXAMPLES[:4]), opt)
    return checkpoint_payload(model, src_vocab=VOCAB, tgt_vocab=VOCAB, optimizer=opt,
                              train_config=TrainConfig(),
                              train_state=TrainState(step=1, position=1))


def _set(section: str, key: str, value: Any) -> Callable[[dict], dict]:
    def change(p: dict) -> dict:
        p[section] = {**p[section], key: value}
        return p
    return change


def _without(section: str, key: str | None = None) -> Callable[[dict], dict]:
    def change(p: dict) -> dict:
        if key is None:
            del p[section]
        else:
            p[section] = {k: v for k, v in p[section].items() if k != key}
        return p
    return change


def _wrong_shape(p: dict) -> dict:
    p["model"]["encoder.embedding.weight"] = torch.zeros(17, 8)
    return p


def _non_finite(value: float) -> Callable[[dict], dict]:
    def change(p: dict) -> dict:
        p["model"]["decoder.attention.v_a"][2] = value
        return p
    return change


WEIGHT_KEYS = list(tiny_model().state_dict())
FITS = "checkpoint weights do not fit the model: "

# (name, change to a good payload, what the message must say, entry points that check it)
MALFORMED = [
    ("bare state_dict", lambda p: dict(p["model"]),
     "not a bahdanau checkpoint: its 'format' is None", "file restore resume"),
    ("foreign dict", lambda p: {"epoch": 3, "weights": p["model"]},
     "not a bahdanau checkpoint: its 'format' is None", "file restore resume"),
    ("missing section", _without("tgt_vocab"),
     "checkpoint of format 2 lacks ['tgt_vocab']", "file restore resume"),
    ("model_config not a dict", lambda p: {**p, "model_config": [16, 16]},
     "checkpoint model_config is a list, not a dict", "file restore resume"),
    ("model_config refused", _set("model_config", "hidden_size", 0),
     "checkpoint model_config is malformed: hidden_size must be >= 1, got 0",
     "file restore resume"),
    ("model_config incomplete", _without("model_config", "src_vocab_size"),
     "checkpoint model_config is malformed: ModelConfig fields ['src_vocab_size'] are missing",
     "file restore resume"),
    ("model not a dict", lambda p: {**p, "model": [1.0]},
     "checkpoint weights are a list, not a state_dict", "file restore resume"),
    ("missing weight", _without("model", WEIGHT_KEYS[0]),
     f"{FITS}{WEIGHT_KEYS[0]!r} is missing", "file restore resume"),
    ("unexpected weight", _set("model", "decoder.extra.weight", torch.zeros(2)),
     f"{FITS}'decoder.extra.weight' is not one of its weights", "file restore resume"),
    ("wrong shape", _wrong_shape,
     f"{FITS}'encoder.embedding.weight' has shape (17, 8), the model's has (16, 8)",
     "file restore resume"),
    ("weight not a tensor", _set("model", WEIGHT_KEYS[-1], [0.0]),
     f"{FITS}{WEIGHT_KEYS[-1]!r} is a list, not a tensor", "file restore resume"),
    ("NaN weight", _non_finite(math.nan),
     "checkpoint weight 'decoder.attention.v_a' holds NaN or inf", "file restore resume"),
    ("inf weight", _non_finite(-math.inf),
     "checkpoint weight 'decoder.attention.v_a' holds NaN or inf", "file restore resume"),
    ("src_vocab refused", _set("src_vocab", "tokens", ["w0", *VOCAB.tokens]),
     "checkpoint src_vocab is malformed: duplicate vocabulary token 'w0' at ids 4 and 5",
     "file restore resume"),
    ("tgt_vocab keys", _without("tgt_vocab", "specials"),
     "checkpoint tgt_vocab is malformed: a Vocab dict needs exactly the keys",
     "file restore resume"),
    ("train_state refused", _set("train_state", "step", -1),
     "checkpoint train_state is malformed: TrainState.step must be an int >= 0, got -1",
     "restore resume"),
    ("train_state unknown field", _set("train_state", "steps", 1),
     "checkpoint train_state is malformed: unknown TrainState fields ['steps']", "restore resume"),
    ("train_state best_metric", _set("train_state", "best_metric", "high"),
     "checkpoint train_state is malformed: TrainState.best_metric must be a number or None, "
     "got 'high'", "restore resume"),
    ("Adam state into Adadelta", lambda p: _payload("adam"),
     "checkpoint optimizer state is of Adam, the given optimizer is Adadelta", "restore resume"),
    ("optimizer not a state_dict", lambda p: {**p, "optimizer": {"state": {}}},
     "checkpoint optimizer is not an optimizer's state_dict", "restore resume"),
]


@pytest.mark.parametrize(("change", "expected", "where"), [case[1:] for case in MALFORMED],
                         ids=[case[0] for case in MALFORMED])
def test_malformed_checkpoint_is_one_line_naming_file_and_problem(
        tmp_path, change: Callable[[dict], dict], expected: str, where: str) -> None:
    bad = change(_payload())
    path = tmp_path / "step_00000001.pt"
    save_checkpoint(path, bad)
    if "file" in where:
        message = _one_line_error(lambda: model_from_checkpoint(path))
        assert message.startswith(f"{path}: ") and expected in message
    if "restore" in where:
        model = tiny_model(2)
        opt = make_optimizer(model, TrainConfig())
        train_step(model, collate(EXAMPLES[4:8]), opt)
        weights, opt_state = _snapshot(model), copy.deepcopy(opt.state_dict())
        message = _one_line_error(lambda: restore(load_checkpoint(path), model, opt,
                                                  src_vocab=VOCAB, tgt_vocab=VOCAB))
        assert expected in message
        assert _same_tensors(_snapshot(model), weights)
        assert str(opt.state_dict()) == str(opt_state)
    if "resume" in where:
        model = tiny_model(3)
        weights, files = _snapshot(model), sorted(os.listdir(tmp_path))
        message = _one_line_error(lambda: setup_run(
            model, EXAMPLES, TrainConfig(max_steps=3), src_vocab=VOCAB, tgt_vocab=VOCAB,
            checkpoint_dir=tmp_path))
        assert message.startswith(f"{path}: ") and expected in message
        assert _same_tensors(_snapshot(model), weights)
        assert sorted(os.listdir(tmp_path)) == files


def test_optimizer_of_the_same_type_restores() -> None:
    """The recorded optimizer class refuses only another type."""
    payload = _payload("adam")
    assert payload["optimizer_class"] == "Adam"
    model = tiny_model(2)
    opt = make_optimizer(model, TrainConfig(optimizer="adam"))
    restore(payload, model, opt)
    assert str(opt.state_dict()["state"]) == str(payload["optimizer"]["state"])


# ----------------------------------------------------------------------------------------------
# best.json


def _steps(run: TrainRun, metrics: dict[int, float | None]) -> Iterator[tuple[int, float | None]]:
    """Train `run` one step per entry of `metrics`, validating with `metrics[step]` where it is
    not None; yields (step, the metric if it improved on the best so far, else None)."""
    for step, metric in metrics.items():
        run_step(run)
        improved = False
        if metric is not None:
            _, improved = validate_run(run, lambda model, m=metric: m)
        yield step, metric if improved else None


def _trained_dir(directory: Path, metrics: dict[int, float | None]) -> dict[int, dict]:
    """Train step by step, validating with `metrics[step]` and saving every step through
    `save_run`; returns the saved weights by step."""
    run = setup_run(tiny_model(0), EXAMPLES, CFG, src_vocab=VOCAB, tgt_vocab=VOCAB,
                    checkpoint_dir=directory)
    weights = {}
    for step, best_metric in _steps(run, metrics):
        save_run(run, metric=best_metric)
        weights[step] = _snapshot(run.model)
    return weights


@pytest.mark.parametrize("damage", [b"{not json", b'{"metric": 2.0}',
                                    b'{"metric": "x", "step": 2}', b'{"metric": NaN, "step": 2}',
                                    b"\xff\xfe", b"[]", None],
                         ids=["invalid JSON", "missing key", "metric a string", "NaN",
                              "not UTF-8", "a list", "missing"])
def test_damaged_best_json_is_rebuilt_from_best_pt(tmp_path, damage: bytes | None) -> None:
    weights = _trained_dir(tmp_path, {1: 1.0, 2: 2.0, 3: 0.5})
    info = tmp_path / "best.json"
    assert json.loads(info.read_text()) == {"metric": 2.0, "step": 2, "name": "bleu"}
    if damage is None:
        info.unlink()
    else:
        info.write_bytes(damage)
    manager = CheckpointManager(tmp_path, keep_last=CFG.keep_last)
    assert (manager.best_metric, manager.best_step) == (2.0, 2)
    run = setup_run(tiny_model(5), EXAMPLES, CFG, src_vocab=VOCAB, tgt_vocab=VOCAB,
                    checkpoint_dir=tmp_path)
    assert run.state.step == 3 and _same_tensors(_snapshot(run.model), weights[3])
    assert json.loads(info.read_text()) == {"metric": 2.0, "step": 2,   # rewritten on resume
                                            "name": "bleu"}
    assert _same_tensors(load_checkpoint(tmp_path / "best.pt")["model"], weights[2])


@pytest.mark.parametrize("best_pt", [b"not a checkpoint", None], ids=["garbage", "missing"])
def test_damaged_best_json_without_usable_best_pt_is_one_line(tmp_path, best_pt) -> None:
    _trained_dir(tmp_path, {1: 1.0})
    info = tmp_path / "best.json"
    info.write_bytes(b"{not json")
    if best_pt is None:
        (tmp_path / "best.pt").unlink()
    else:
        (tmp_path / "best.pt").write_bytes(best_pt)
    for call in (lambda: CheckpointManager(tmp_path),
                 lambda: setup_run(tiny_model(5), EXAMPLES, CFG, src_vocab=VOCAB, tgt_vocab=VOCAB,
                                   checkpoint_dir=tmp_path)):
        message = _one_line_error(call)
        assert message.startswith(f"{info}: unreadable (JSONDecodeError), and best.pt cannot "
                                  "rebuild it: ")


def test_best_json_without_a_best_in_best_pt_is_one_line(tmp_path) -> None:
    manager = CheckpointManager(tmp_path)
    weights_only = checkpoint_payload(tiny_model(), src_vocab=VOCAB, tgt_vocab=VOCAB)
    manager.save(1, weights_only, metric=1.0)   # no train_state in best.pt
    (tmp_path / "best.json").write_text("{}")
    message = _one_line_error(lambda: CheckpointManager(tmp_path))
    assert message == (f"{tmp_path / 'best.json'}: not {{\"metric\": number, \"step\": int}}, and "
                       "best.pt records no best metric and step to rebuild it from")


# ----------------------------------------------------------------------------------------------
# CheckpointManager: the order of the writes, rotation


def test_save_writes_step_then_best_then_best_json_then_rotates(tmp_path, monkeypatch) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, {"step": 1}, metric=1.0)
    done: list[tuple[str, str]] = []
    replace_, unlink = os.replace, os.unlink
    monkeypatch.setattr(os, "replace",
                        lambda src, dst: (done.append(("write", Path(dst).name)),
                                          replace_(src, dst))[1])
    monkeypatch.setattr(os, "unlink",
                        lambda path: (done.append(("delete", Path(path).name)), unlink(path))[1])
    manager.save(2, {"step": 2, "w": torch.ones(3)}, metric=2.0)
    monkeypatch.undo()
    assert done == [("write", "step_00000002.pt"), ("write", "best.pt"),
                    ("write", "best.json"), ("delete", "step_00000001.pt")]
    assert (tmp_path / "best.pt").read_bytes() == (tmp_path / "step_00000002.pt").read_bytes()


def test_best_pt_is_a_link_that_outlives_the_rotation_of_its_step_file(tmp_path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, {"step": 1, "w": torch.zeros(1000)}, metric=2.0)
    step_file = tmp_path / "step_00000001.pt"
    assert (tmp_path / "best.pt").stat().st_ino == step_file.stat().st_ino   # one file on disk
    expected = step_file.read_bytes()
    manager.save(2, {"step": 2, "w": torch.ones(1000)}, metric=1.0)   # not the best
    assert not step_file.exists()                                     # rotated away
    assert (tmp_path / "best.pt").read_bytes() == expected
    assert load_checkpoint(tmp_path / "best.pt")["step"] == 1


def test_best_pt_is_a_copy_where_links_fail(tmp_path, monkeypatch) -> None:
    def no_links(src: Any, dst: Any) -> None:
        raise OSError("links are not supported here")

    monkeypatch.setattr(os, "link", no_links)
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, {"step": 1, "w": torch.zeros(10)}, metric=2.0)
    best, step_file = tmp_path / "best.pt", tmp_path / "step_00000001.pt"
    assert best.stat().st_ino != step_file.stat().st_ino
    assert best.read_bytes() == step_file.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "best.pt",
                                                          "step_00000001.pt"]


def test_rotation_keeps_the_file_just_written(tmp_path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(5, {"step": 5})
    manager.save(3, {"step": 3})   # e.g. a run restarted from an earlier step by hand
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003.pt", "step_00000005.pt"]
    manager.save(7, {"step": 7})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000007.pt"]


# ----------------------------------------------------------------------------------------------
# Fault injection: the process dies between any two writes of a save



class _Killed(BaseException):
    """The process died here (a BaseException, as KeyboardInterrupt, so no `except
    Exception` handles it)."""


@contextmanager
def _dies_after(monkeypatch: pytest.MonkeyPatch, k: int) -> Iterator[list[int]]:
    """os.fsync, os.replace and os.unlink (pathlib's too) work `k` times, then every call raises
    `_Killed`, as a dead process writes nothing more: cleanups on the way out are skipped too."""
    count = [0]

    def mortal(op: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if count[0] >= k:
                raise _Killed
            count[0] += 1
            return op(*args, **kwargs)
        return call

    with monkeypatch.context() as patch:
        for name in ("fsync", "replace", "unlink"):
            patch.setattr(os, name, mortal(getattr(os, name)))
        yield count


@pytest.fixture(scope="module")
def reference() -> dict[int, tuple[dict, float | None]]:
    """An uninterrupted run's saves: {step: (payload, metric given to CheckpointManager.save)}."""
    run = setup_run(tiny_model(0), EXAMPLES, CFG, src_vocab=VOCAB, tgt_vocab=VOCAB)
    saves = {}
    for step, best_metric in _steps(run, METRICS):
        payload = checkpoint_payload(run.model, src_vocab=VOCAB, tgt_vocab=VOCAB,
                                     optimizer=run.optimizer, train_config=CFG,
                                     train_state=run.state)
        saves[step] = (copy.deepcopy(payload), best_metric)
    return saves


def _check_resume(directory: Path, reference: dict[int, tuple[dict, float | None]]) -> int:
    """Resume from `directory` and check that the latest and the best checkpoint hold exactly
    the weights of the steps they claim; returns the step resumed from (0: none)."""
    run = setup_run(tiny_model(9), EXAMPLES, CFG, src_vocab=VOCAB, tgt_vocab=VOCAB,
                    checkpoint_dir=directory)
    manager, step = run.manager, run.state.step
    if step == 0:   # no numbered checkpoint became durable: nothing else may have
        assert manager.latest() is None and manager.best() is None
        return 0
    payload = reference[step][0]
    assert manager.latest() == manager.path_for(step)
    assert _same_tensors(_snapshot(run.model), payload["model"])
    for path in manager.checkpoints():   # every numbered file left is whole and its name's step
        stored = load_checkpoint(path)
        assert _same_tensors(stored["model"], reference[stored["train_state"]["step"]][0]["model"])
        assert path == manager.path_for(stored["train_state"]["step"])
    best_step = payload["train_state"]["best_step"]   # the best as of the step resumed from
    assert (manager.best_metric, manager.best_step) == (METRICS[best_step], best_step)
    info = json.loads((directory / "best.json").read_text())
    name = info.pop("name", None)        # a manager given no metric writes none; a run names it
    assert info == {"metric": METRICS[best_step], "step": best_step} and name in (None, "bleu")
    best = load_checkpoint(manager.best())
    assert best["train_state"]["step"] == best_step
    assert _same_tensors(best["model"], reference[best_step][0]["model"])
    # the run goes on: its next save works and clears what the dead process left
    run_step(run)
    save_run(run)
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]
    return step


@pytest.mark.parametrize("crash_step", list(METRICS))
def test_crash_between_any_two_writes_loses_neither_latest_nor_best(
        tmp_path, monkeypatch, reference, crash_step: int) -> None:
    k, finished = 0, False
    resumed_from = set()
    while not finished:
        directory = tmp_path / f"k{k}"
        manager = CheckpointManager(directory, keep_last=CFG.keep_last)
        for step in range(1, crash_step):
            payload, metric = reference[step]
            manager.save(step, payload, metric=metric)
        payload, metric = reference[crash_step]
        with _dies_after(monkeypatch, k):
            try:
                manager.save(crash_step, payload, metric=metric)
                finished = True
            except _Killed:
                pass
        resumed_from.add(_check_resume(directory, reference))
        k += 1
    # the step file is 3 operations (fsync file, replace, fsync directory), so is best.json;
    # best.pt, a link to the durable step file, is 2 (replace, fsync directory); a rotation 1
    # per file
    writes = {1: 8, 2: 3, 3: 9, 4: 4}[crash_step]
    assert k == writes + 1
    assert resumed_from == {crash_step - 1, crash_step}


def test_crash_while_completing_an_interrupted_save(tmp_path, monkeypatch, reference) -> None:
    """The resume's own writes (best.pt, best.json) may be cut short too; the next resume
    finishes them."""
    payload, metric = reference[3]
    k, finished = 0, False
    while not finished:
        directory = tmp_path / f"k{k}"
        manager = CheckpointManager(directory, keep_last=CFG.keep_last)
        for step in (1, 2):
            earlier, earlier_metric = reference[step]
            manager.save(step, earlier, metric=earlier_metric)
        with _dies_after(monkeypatch, 3):   # step_00000003.pt is durable, best.pt is not
            with pytest.raises(_Killed):
                manager.save(3, payload, metric=metric)
        with _dies_after(monkeypatch, k) as count:
            try:
                setup_run(tiny_model(9), EXAMPLES, CFG, src_vocab=VOCAB, tgt_vocab=VOCAB,
                          checkpoint_dir=directory)
                finished = True
            except _Killed:
                pass
        assert _check_resume(directory, reference) == 3
        k += 1
    assert count[0] == 5   # best.pt (a link) 2 operations, best.json 3
