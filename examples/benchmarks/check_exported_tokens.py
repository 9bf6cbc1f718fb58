"""Do a checkpoint's exported programs decode the Multi30k test set to the library's tokens?

Exports the checkpoint (`bahdanau.serving.export_folder`, with ONNX unless --no-onnx: the onnx
extra) into a temporary folder, then decodes the 1,000 test_2016_flickr sentences (en -> the
checkpoint's target side, as the vocabularies and tokenizer say) four or six ways, each in
batches of --batch-size sentences sorted by length:

- the library: `BeamSearch` (beam --beam-size, length penalty none: `bahdanau translate`) and
  `BeamSearch(beam_size=1)` on the checkpoint's model;
- the exported folder's ``decode.py`` (`bahdanau.serving.decode`): `beam_decode` and
  `greedy_decode` over the torch programs (``torch.export.load``) and over the ONNX programs
  (onnxruntime),

and prints, for each, how many sentences have exactly the library's tokens, and the seconds
it took. The check is exact token identity: a program's float rounding differs from the model's,
so a near tie can flip a token; the tests (tests/unit/test_standalone_export.py) hold smaller
models to identity.

    python examples/benchmarks/check_exported_tokens.py --checkpoint runs/multi30k-en-fr
    python examples/benchmarks/check_exported_tokens.py --checkpoint model.pt --sentences 200
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bahdanau import BeamSearch
from bahdanau.checkpoint.reader import find_checkpoint
from bahdanau.data import multi30k_files, pad_sources, read_lines
from bahdanau.serving import decode, export_folder
from bahdanau.translate import load


def batches(ids: list[list[int]], batch_size: int, pad_id: int):
    """(positions, padded batch) of sentences sorted by length."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        yield chunk, pad_sources([ids[i] for i in chunk], pad_id)


def decode_all(ids: list[list[int]], batch_size: int, pad_id: int,
               decode_batch: Callable[[torch.Tensor, torch.Tensor], list[list[int]]]
               ) -> tuple[list[list[int]], float]:
    out: list[list[int]] = [[] for _ in ids]
    start = time.perf_counter()
    for chunk, (src, lengths) in batches(ids, batch_size, pad_id):
        for i, tokens in zip(chunk, decode_batch(src, lengths), strict=True):
            out[i] = tokens
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True,
                        help="a checkpoint file or a run folder (its best, else latest)")
    parser.add_argument("--sentences", type=int, default=1000, help="the first N test sentences")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--no-onnx", action="store_true", help="the torch programs alone")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    checkpoint = find_checkpoint(args.checkpoint, "--checkpoint")
    t = load(checkpoint)
    sentences = read_lines(multi30k_files("test_2016_flickr", "en"))[:args.sentences]
    ids = [t.src_vocab.encode(t.tokenizer.tokenize(s)) for s in sentences]
    config = t.model.config
    special = {"bos_id": config.bos_id, "eos_id": config.eos_id, "pad_id": config.pad_id}
    searches = {"beam": BeamSearch(beam_size=args.beam_size), "greedy": BeamSearch(beam_size=1)}
    rows = []
    want = {}
    for name, search in searches.items():
        want[name], seconds = decode_all(
            ids, args.batch_size, special["pad_id"],
            lambda src, lengths, s=search: [h[0].tokens for h in s(t.model, src, lengths)])
        rows.append((f"library {name}", len(ids), seconds))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "exported"
        start = time.perf_counter()
        export_folder(t.model, t.src_vocab, t.tgt_vocab, t.tokenizer, folder,
                      onnx=not args.no_onnx)
        print(f"exported {checkpoint} in {time.perf_counter() - start:.1f} s")
        for runtime in ("torch",) if args.no_onnx else ("torch", "onnx"):
            encoder, step, _ = decode.load_programs(folder, runtime)
            loops = {"beam": functools.partial(decode.beam_decode, encoder, step,
                                               beam_size=args.beam_size, **special),
                     "greedy": functools.partial(decode.greedy_decode, encoder, step,
                                                 **special)}
            for name, loop in loops.items():
                got, seconds = decode_all(ids, args.batch_size, special["pad_id"], loop)
                same = sum(g == w for g, w in zip(got, want[name], strict=True))
                rows.append((f"{runtime} decode.py {name}", same, seconds))
    print(f"{'decoder':<24} {'identical to the library':>26} {'seconds':>9}")
    for name, same, seconds in rows:
        print(f"{name:<24} {f'{same:,} / {len(ids):,}':>26} {seconds:>9.1f}")


if __name__ == "__main__":
    main()
