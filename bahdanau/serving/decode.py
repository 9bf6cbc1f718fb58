"""Greedy and beam search over an exported model's two programs, in plain PyTorch.

`bahdanau export` copies this file into every exported folder as ``decode.py``: it imports
torch alone (never `bahdanau`), so a serving process decodes with the folder and torch, or
onnxruntime for the ONNX programs (``bahdanau export --onnx``)::

    import torch, decode                        # decode.py, beside the folder's files
    encoder, step, manifest = decode.load_programs("FOLDER")   # or runtime="onnx"
    ids = {k: manifest[k] for k in ("bos_id", "eos_id", "pad_id")}
    src = torch.tensor([[5, 6, 7]])             # source ids (src_vocab.json), padded with pad
    print(decode.beam_decode(encoder, step, src, torch.tensor([3]), **ids))

The programs' interface (the folder's README): ``encoder(src (B, S), src_lengths (B,))`` gives
s_0 (B, D) and the per-sentence memory tensors; ``step(prev_tokens (N,), hidden (N, D),
*memory)`` gives the next token's log-probabilities (N, V), s_i (N, D) and, for attention
models, the weights (N, S); the step takes as many memory rows as state rows. Sources are padded
to at least `MIN_SRC_LEN` positions (`pad_source`).

`greedy_decode` gives the tokens of `bahdanau translate --beam-size 1` and `beam_decode` those
of ``bahdanau translate`` (`bahdanau.search.BeamSearch` with n_best 1, early stopping, no
max_len_ratio): the same candidates in the same order, with the same length normalisation, so
the same hypotheses win. (Of exactly equal log-probabilities of one beam's next tokens, which a
trained model all but never gives, the two may keep different ones: on a CPU the library finds a
beam's best tokens in two stages, `bahdanau.kernels.grouped_topk`.) Both raise `BadRequest`
for a batch or a setting they cannot decode right (`check_request`), and `NaNScores` for a step
whose log-probabilities hold NaN (a diverged model), where a NaN would win the argmax.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

MIN_SRC_LEN = 2      # the shortest padded source the programs take


class NaNScores(ValueError):
    """The model's scores are NaN."""

    def __init__(self) -> None:
        super().__init__("the model's scores are NaN: its weights hold NaN or inf, or give "
                         "logits that overflow (a diverged training run)")


class BadRequest(ValueError):
    """A batch or a setting the programs would decode wrongly, or fail on."""


PENALTIES = ("none", "average", "gnmt")


def check_request(src: Tensor, src_lengths: Tensor, pad_id: int, *, max_len: int,
                  min_len: int, beam_size: int = 1, length_penalty: str = "none") -> None:
    """Refuse, before the programs run, what `greedy_decode` and `beam_decode` cannot decode
    right: `src` not a (B, S) int64 tensor of at least one sentence, negative ids, lengths
    outside [1, S] or that disagree with the padding (a pad before a sentence's end, or a real
    token after it: the programs would read another sentence), and settings out of range.

    Raises:
        BadRequest: naming the problem, in one line.
    """
    if not isinstance(src, Tensor) or src.dim() != 2 or src.dtype != torch.long:
        raise BadRequest(f"src must be a (B, S) int64 tensor, got {_shown(src)}")
    if (not isinstance(src_lengths, Tensor) or src_lengths.dtype != torch.long
            or tuple(src_lengths.shape) != (src.shape[0],)):
        raise BadRequest(f"src_lengths must be a ({src.shape[0]},) int64 tensor, got "
                         f"{_shown(src_lengths)}")
    if src.shape[0] == 0:
        raise BadRequest("src holds no sentence")
    if bool((src < 0).any()):
        raise BadRequest("src holds a negative id")
    if bool(((src_lengths < 1) | (src_lengths > src.shape[1])).any()):
        raise BadRequest(f"src_lengths must be in [1, {src.shape[1]}], got "
                         f"{src_lengths.tolist()}")
    real = torch.arange(src.shape[1], device=src.device)[None, :] < src_lengths[:, None]
    wrong = ((src == pad_id) == real).any(1)          # a pad inside, or a token after the end
    if bool(wrong.any()):
        row = int(wrong.nonzero()[0])
        raise BadRequest(f"sentence {row}: src_lengths and the padding (pad_id={pad_id}) "
                         "disagree")
    for name, value, low in (("beam_size", beam_size, 1), ("min_len", min_len, 0),
                             ("max_len", max_len, max(min_len, 1))):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise BadRequest(f"{name} must be an int >= {low}, got {value!r}")
    if length_penalty not in PENALTIES:
        raise BadRequest(f"length_penalty must be one of {PENALTIES}, got {length_penalty!r}")


def _shown(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')} tensor"
    return type(value).__name__


def pad_source(src: Tensor, pad_id: int) -> Tensor:
    """`src` padded to the programs' shortest source, `MIN_SRC_LEN` (padding changes nothing)."""
    short = MIN_SRC_LEN - src.shape[1]
    return torch.nn.functional.pad(src, (0, short), value=pad_id) if short > 0 else src


@torch.no_grad()         # with gradients on, each scan of the encoder would trace its backward
def greedy_decode(encoder: Any, step: Any, src: Tensor, src_lengths: Tensor, *, bos_id: int,
                  eos_id: int, pad_id: int, max_len: int = 100, min_len: int = 1
                  ) -> list[list[int]]:
    """Greedy search over the programs.

    Args:
        encoder, step: the programs as callables (`load_programs`).
        src: (B, S) source ids, padded with `pad_id`; src_lengths: (B,) real lengths.
        bos_id, eos_id, pad_id: the special ids (``manifest.json``).
        max_len: most tokens before eos; min_len: eos is forbidden before this many.
    Returns:
        For each sentence its target ids, without bos and eos.
    Raises:
        BadRequest: `check_request`'s, before the programs run.
        NaNScores: the step's log-probabilities hold NaN.
    """
    check_request(src, src_lengths, pad_id, max_len=max_len, min_len=min_len)
    hidden, *memory = encoder(pad_source(src, pad_id), src_lengths)
    rows = torch.arange(src.shape[0], device=src.device)      # the sentences still decoding
    tokens = torch.full_like(rows, bos_id)
    out: list[list[int]] = [[] for _ in range(src.shape[0])]
    for t in range(max_len + 1):
        log_probs, hidden, *_ = step(tokens, hidden, *memory)   # (N, V), (N, D)[, (N, S)]
        if bool(log_probs.isnan().any()):        # NaN would win the argmax: a diverged model
            raise NaNScores()
        log_probs[:, [pad_id, bos_id]] = float("-inf")          # never generated
        if t < min_len:
            log_probs[:, eos_id] = float("-inf")
        tokens = log_probs.argmax(dim=1) if t < max_len else torch.full_like(tokens, eos_id)
        going = tokens != eos_id
        for row, token in zip(rows[going].tolist(), tokens[going].tolist(), strict=True):
            out[row].append(token)
        if not bool(going.any()):
            break
        rows, tokens, hidden = rows[going], tokens[going], hidden[going]
        memory = [m[going] for m in memory]
    return out


def normalise(log_prob: Tensor, length: int, penalty: str, alpha: float) -> Tensor:
    """The score of hypotheses of `length` tokens, eos counted: "none" (the paper),
    "average" (log p / |Y|) or "gnmt" (log p / ((5 + |Y|) / 6) ** alpha)."""
    if penalty == "none":
        return log_prob
    size = torch.tensor(length, dtype=log_prob.dtype, device=log_prob.device)  # in its dtype
    if penalty == "average":
        return log_prob / size
    return log_prob / ((5.0 + size) / 6.0) ** alpha


@torch.no_grad()
def beam_decode(encoder: Any, step: Any, src: Tensor, src_lengths: Tensor, *, bos_id: int,
                eos_id: int, pad_id: int, beam_size: int = 5, max_len: int = 100,
                min_len: int = 1, length_penalty: str = "none", alpha: float = 0.6
                ) -> list[list[int]]:
    """Beam search over the programs, K = `beam_size` beams a sentence.

    Each step extends every beam by its best 2K tokens and keeps the best 2K extensions of a
    sentence: those ending in eos among the first K finish, the first K others continue. A
    sentence stops at its length cap (where only eos may follow) or once no live beam can beat
    its best finished score; the best finished hypothesis (the earliest among equals) wins.

    Args:
        encoder, step, src, src_lengths, bos_id, eos_id, pad_id, max_len, min_len: as
            `greedy_decode`.
        beam_size: K.
        length_penalty: "none", "average" or "gnmt" (`normalise`); alpha: the gnmt exponent.
    Returns:
        For each sentence the best hypothesis's target ids, without bos and eos.
    Raises:
        BadRequest: `check_request`'s, before the programs run.
        NaNScores: a live beam's log-probability is NaN.
        ValueError: a sentence got no hypothesis (every ending scored -inf).
    """
    check_request(src, src_lengths, pad_id, max_len=max_len, min_len=min_len,
                  beam_size=beam_size, length_penalty=length_penalty)
    K, n_sent = beam_size, src.shape[0]
    hidden, *memory = encoder(pad_source(src, pad_id), src_lengths)
    rows = torch.arange(n_sent, device=src.device).repeat_interleave(K)     # K rows a sentence
    hidden, memory = hidden[rows], [m[rows] for m in memory]
    dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    active = torch.arange(n_sent, device=src.device)          # the sentences still searching
    scores = torch.full((n_sent, K), float("-inf"), dtype=dtype, device=src.device)
    scores[:, 0] = 0.0                                         # one live beam to start
    kept = torch.full((n_sent,), float("-inf"), dtype=dtype, device=src.device)
    tokens = torch.full((n_sent * K,), bos_id, dtype=torch.long, device=src.device)
    paths = torch.zeros((n_sent * K, 0), dtype=torch.long, device=src.device)
    best: list[tuple[float, list[int]] | None] = [None] * n_sent
    for t in range(max_len + 1):
        log_probs, hidden, *_ = step(tokens, hidden, *memory)
        b = active.shape[0]
        log_probs = log_probs.view(b, K, -1)
        log_probs[..., [pad_id, bos_id]] = float("-inf")       # never generated
        if t < min_len:
            log_probs[..., eos_id] = float("-inf")
        if t == max_len:                                        # the cap: eos alone
            capped = torch.full_like(log_probs, float("-inf"))
            capped[..., eos_id] = log_probs[..., eos_id]
            log_probs = capped
        top_scores, top_parent, top_token, finished, order = _candidates(scores, log_probs,
                                                                         eos_id)
        scores, parent = top_scores.gather(1, order), top_parent.gather(1, order)
        if bool(scores.isnan().any()):           # a NaN ranks first: a diverged model
            raise NaNScores()
        normalised = normalise(top_scores, t + 1, length_penalty, alpha)
        kept = torch.maximum(kept, normalised.masked_fill(~finished, float("-inf")).amax(1))
        for i, r in finished.nonzero().tolist():               # in rank order
            sent, log_prob = int(active[i]), float(top_scores[i, r])
            score = float(normalise(torch.tensor(log_prob, dtype=torch.float64), t + 1,
                                    length_penalty, alpha))
            found = best[sent]
            if found is None or score > found[0]:               # the earliest among equals
                best[sent] = (score, paths[i * K + int(top_parent[i, r])].tolist())
        bound = normalise(scores.amax(1), max_len + 1, length_penalty, alpha)
        done = ~torch.isfinite(scores).any(1) | (torch.isfinite(kept) & (kept >= bound))
        if t == max_len or bool(done.all()):
            break
        beam_rows = (torch.arange(b, device=src.device)[:, None] * K + parent).flatten()
        tokens = top_token.gather(1, order).flatten()
        paths = torch.cat([paths[beam_rows], tokens[:, None]], dim=1)
        hidden = hidden[beam_rows]
        if bool(done.any()):                                    # the done sentences leave
            keep = (~done).nonzero().flatten()
            keep_rows = (keep[:, None] * K + torch.arange(K, device=src.device)).flatten()
            active, scores, kept = active[keep], scores[keep], kept[keep]
            tokens, paths, hidden = tokens[keep_rows], paths[keep_rows], hidden[keep_rows]
            memory = [m[keep_rows] for m in memory]
    if any(found is None for found in best):
        raise ValueError(f"sentence {best.index(None)} of the batch got no hypothesis: the "
                         "model gives every ending a log-probability of -inf")
    return [found[1] for found in best if found is not None]


def _candidates(scores: Tensor, log_probs: Tensor, eos_id: int
                ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The best 2K extensions of K beams for b sentences, from their (b, K) log-probabilities
    and (b, K, V) next-token log-probabilities: each beam's best 2K first, then the best 2K of
    those. Returns their (b, 2K) log-probabilities, beams and tokens, which of them finish (eos
    among the first K, finite) and the (b, K) positions of the first K others, which continue."""
    b, K, vocab = log_probs.shape
    width = min(2 * K, vocab)
    beam_best, beam_token = log_probs.topk(width, dim=2)                  # (b, K, w)
    candidates = (scores[:, :, None] + beam_best).reshape(b, K * width)
    top_scores, top_index = candidates.topk(min(2 * K, K * width), dim=1)   # (b, 2K)
    top_token = beam_token.reshape(b, K * width).gather(1, top_index)
    is_eos = top_token == eos_id
    rank = torch.arange(top_scores.shape[1], device=scores.device)
    finished = is_eos & (rank < K) & torch.isfinite(top_scores)
    order = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :K]
    return top_scores, top_index // width, top_token, finished, order


def load_programs(folder: str | Path, runtime: str = "torch") -> tuple[Any, Any, dict]:
    """The encoder and step programs of an exported folder, and its manifest.

    ``torch.export.load`` trusts its file (it unpickles members of an archive and evaluates
    strings of its graph), as onnxruntime trusts an ONNX file's graph: load only folders you
    trust (`bahdanau.serving.load_exported` checks a folder's digests and traces the programs
    again from its weights instead).

    Args:
        folder: the exported folder.
        runtime: "torch" (``encoder.pt2``, ``step.pt2``) or "onnx" (``encoder.onnx``,
            ``step.onnx`` through onnxruntime, which must be installed).
    Returns:
        (encoder, step, manifest), the programs as callables of tensors.
    """
    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    encoder: Any
    step: Any
    if runtime == "torch":
        encoder, step = (torch.export.load(folder / f"{name}.pt2").module()
                         for name in ("encoder", "step"))
    elif runtime == "onnx":
        encoder, step = (OnnxProgram(folder / f"{name}.onnx") for name in ("encoder", "step"))
    else:
        raise ValueError(f'runtime must be "torch" or "onnx", got {runtime!r}')
    return encoder, step, manifest


class OnnxProgram:
    """An ONNX program run by onnxruntime on the CPU, called as a torch program is: tensors
    in (in the program's input order), a list of tensors out."""

    def __init__(self, path: str | Path) -> None:
        import onnxruntime  # the onnx extra: imported only for ONNX programs

        self.session = onnxruntime.InferenceSession(str(path),
                                                    providers=["CPUExecutionProvider"])
        self.names = [node.name for node in self.session.get_inputs()]

    def __call__(self, *tensors: Tensor) -> list[Tensor]:
        if len(tensors) != len(self.names):
            raise ValueError(f"this program takes {len(self.names)} inputs, got {len(tensors)}")
        feeds = {name: t.detach().cpu().numpy()
                 for name, t in zip(self.names, tensors, strict=True)}
        return [torch.from_numpy(array) for array in self.session.run(None, feeds)]

