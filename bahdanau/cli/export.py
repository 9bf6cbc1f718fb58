"""`bahdanau export`: a checkpoint as programs for serving (`bahdanau.serving.export_folder`)."""

from __future__ import annotations

from bahdanau._folders import Kind
from bahdanau.checkpoint.reader import find_checkpoint, read_checkpoint
from bahdanau.jobs.files import check_output_folder
from bahdanau.jobs.options import ExportOptions
from bahdanau.serving import check_new_folder, export_folder
from bahdanau.serving.onnx_programs import check_onnx


def export(o: ExportOptions) -> int:
    """`bahdanau export`: the encoder and decoder step as `torch.export` programs (and, with
    --onnx, as ONNX), with the vocabularies, the tokenizer, a manifest, the decoding loops
    (``decode.py``) and a README, in a new folder; a model assembled from parts of one's own
    takes --trust-code, as translate does."""
    checkpoint = find_checkpoint(o.checkpoint, "--checkpoint")
    check_output_folder("--out", o.out, {"--checkpoint": checkpoint},   # before any work
                        writes=Kind.EXPORTED)
    check_new_folder(o.out)
    if o.onnx:
        check_onnx()
    read = read_checkpoint(checkpoint, trust_code=o.trust_code)   # a model of parts: trusted?
    folder = export_folder(read.model(), read.src_vocab, read.tgt_vocab, read.tokenizer,
                           o.out, onnx=o.onnx)                # traced on the CPU
    files = ", ".join(sorted(p.name for p in folder.iterdir()))
    print(f"exported {checkpoint} to {folder}: {files}")
    return 0
