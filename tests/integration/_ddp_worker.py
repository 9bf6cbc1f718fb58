"""Run by tests/integration/test_ddp.py: `python _ddp_worker.py OUT_DIR PORT [resume]`.

Spawns 2 CPU processes (gloo), trains a tiny RNNsearch with `bahdanau.training` under
DistributedDataParallel and writes each rank's final weights, log and losses to OUT_DIR; then
takes one float64 SGD step (lr 1) on an update of 4 uneven batches, 2 per process, and rank 0
writes the change of every weight beside the gradient of one process on one batch of all 11
sentences (`float64.pt`).

With `resume`, the processes instead train a model with dropout for 8 updates twice: once
straight, once stopped after 4 and resumed from its checkpoint; each rank writes both final
weights (`resume{rank}.pt`), and whether an update in which only rank 1's loss is infinite was
skipped, and left the weights as they were, on its rank.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bahdanau.config import TrainConfig
from bahdanau.data import Example, Vocab, collate
from bahdanau.models import build_model
from bahdanau.presets import tiny
from bahdanau.training import LossModule, evaluate_loss, leave_process_group, train, train_step

WORLD = 2


def _examples() -> list[Example]:
    # A learnable task: the target copies the source.
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(48):
        n = int(torch.randint(2, 6, (1,), generator=g))
        ids = torch.randint(4, 16, (n,), generator=g).tolist()
        out.append(Example(i, ids, ids))
    return out


def _worker(rank: int, out_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        examples = _examples()
        vocab = Vocab([f"w{i}" for i in range(12)])
        torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
        model = build_model(tiny())
        eval_batches = [collate(examples)]
        lines: list[str] = []
        # accumulation: the first batch of each update runs under no_sync, the second syncs
        cfg = TrainConfig(optimizer="adam", lr=0.01, batch_size=6, bucket=2, max_steps=12,
                          accumulation=2, log_every=4, save_every=100)
        result = train(model, examples, cfg, src_vocab=vocab, tgt_vocab=vocab,
                       checkpoint_dir=Path(out_dir) / "ckpt", log=lines.append)
        torch.manual_seed(0)
        initial = evaluate_loss(build_model(tiny()), eval_batches)[0]
        final = evaluate_loss(model, eval_batches)[0]
        torch.save({"state": model.state_dict(), "lines": lines, "step": result.step,
                    "initial": initial, "final": final}, Path(out_dir) / f"rank{rank}.pt")
        _float64_step(rank, examples, Path(out_dir))
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_process_group()


def _resume_worker(rank: int, out_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        examples, vocab = _examples(), Vocab([f"w{i}" for i in range(12)])
        cfg = TrainConfig(optimizer="adam", lr=0.01, batch_size=6, bucket=2, log_every=100,
                          save_every=100)
        weights = {}
        for name, stops in (("straight", (8,)), ("resumed", (4, 8))):
            for max_steps in stops:       # a new model each time: what a restart builds
                torch.manual_seed(rank)
                model = build_model(replace(tiny(), dropout=0.3, dropout_rnn_inputs=0.2))
                train(model, examples, replace(cfg, max_steps=max_steps), src_vocab=vocab,
                      tgt_vocab=vocab, checkpoint_dir=Path(out_dir) / name, log=lambda _: None)
            weights[name] = model.state_dict()
        torch.save({**weights, **_one_rank_infinite(rank, examples)},
                   Path(out_dir) / f"resume{rank}.pt")
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_process_group()


class _InfiniteOnRank1(torch.nn.Module):
    """A model whose loss is +inf on rank 1 only (its gradient stays finite)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.inner = model

    def loss(self, *args, **kwargs):
        loss_sum, n = self.inner.loss(*args, **kwargs)
        return loss_sum + (math.inf if dist.get_rank() == 1 else 0.0), n


def _one_rank_infinite(rank: int, examples: list[Example]) -> dict[str, bool]:
    torch.manual_seed(0)
    model = build_model(tiny())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step_model = torch.nn.parallel.DistributedDataParallel(LossModule(_InfiniteOnRank1(model)))
    stats = train_step(step_model, collate(examples[6 * rank:6 * rank + 6]),
                       torch.optim.SGD(model.parameters(), lr=1.0))
    return {"skipped": stats.non_finite, "unchanged": all(
        torch.equal(v, before[k]) for k, v in model.state_dict().items())}


def _float64_step(rank: int, examples: list[Example], out_dir: Path) -> None:
    bounds = (0, 3, 8, 10, 11)             # the update's 4 batches; rank r takes 2r and 2r + 1
    batches = [collate(examples[a:b]) for a, b in itertools.pairwise(bounds)]
    torch.manual_seed(3)
    model = build_model(tiny()).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step_model = torch.nn.parallel.DistributedDataParallel(LossModule(model))
    stats = train_step(step_model, batches[2 * rank:2 * rank + 2],
                       torch.optim.SGD(model.parameters(), lr=1.0), clip_norm=None,
                       update_sentences=11)
    if rank != 0:
        return
    reference = build_model(tiny()).double()
    reference.load_state_dict(before)
    loss_sum, n_tokens = reference.loss(*_inputs(collate(examples[:11])))
    (loss_sum / 11).backward()
    torch.save({"change": {k: before[k] - v for k, v in model.state_dict().items()},
                "gradient": {k: p.grad for k, p in reference.named_parameters()},
                "stats": (stats.loss_sum, stats.n_tokens),
                "whole": (float(loss_sum), int(n_tokens))}, out_dir / "float64.pt")


def _inputs(batch):
    return batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out


if __name__ == "__main__":
    worker = _resume_worker if sys.argv[3:] == ["resume"] else _worker
    mp.spawn(worker, args=(sys.argv[1], int(sys.argv[2])), nprocs=WORLD, join=True)
