"""Time BiRNNEncoder forward + backward on its eager paths and on the padded (traced) path.

The padded path is the one `torch.compile` and `torch.export` take; here it is called in eager
mode (`BiRNNEncoder._padded_gru`), so the numbers are its cost without compilation.

Paths:
    packed         torch form, `torch.nn.GRU` over a `PackedSequence` (the eager default)
    padded         torch form, `_padded_gru`: two `bahdanau::gru_layer` calls and the gathers
    paper-loop     paper form, `_paper_gru` (the eager default of that form)
    paper-padded   paper form, `_padded_gru`

    python examples/benchmarks/bench_encoder.py                      # B=80, S=30, E=H=256
    python examples/benchmarks/bench_encoder.py --paths packed padded --repeats 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bahdanau import BiRNNEncoder, functional

PATHS = {"packed": "torch", "padded": "torch", "paper-loop": "paper", "paper-padded": "paper"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=80)
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--size", type=int, default=256, help="E and H")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(args.src_len // 2, args.src_len + 1, (args.batch,), generator=gen)
    lengths[0] = args.src_len
    src = torch.randint(4, 1000, (args.batch, args.src_len), generator=gen)
    mask = functional.lengths_to_mask(lengths, args.src_len)
    src[~mask] = 0
    print(f"B={args.batch} S={args.src_len} E=H={args.size}, lengths {int(lengths.min())}-"
          f"{args.src_len}, {args.threads} threads; forward + backward, ms")
    for path in args.paths:
        torch.manual_seed(0)
        encoder = BiRNNEncoder(1000, args.size, args.size, gru_form=PATHS[path])

        def step(encoder=encoder, path=path) -> None:
            if path.endswith("padded"):
                out = encoder._padded_gru(encoder.embedding(src), lengths, mask)
            else:
                out, _ = encoder(src, lengths)
            out.sum().backward()

        step()                                                        # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            step()
            times.append(1000 * (time.perf_counter() - start))
        print(f"{path:>13}: median {statistics.median(times):7.1f}  min {min(times):7.1f}")


if __name__ == "__main__":
    main()
