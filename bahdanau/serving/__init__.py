"""A trained model as two `torch.export` programs, for decoding without `BeamSearch`.

`export_programs(model)` traces the model's own `encode` and `step` (the decoding path
`translate` runs, with the model's engine) into two `torch.export.ExportedProgram`s whose inputs
and outputs are flat tensors, with the batch B and the source length S dynamic:

    encoder(src (B, S) int64, src_lengths (B,) int64)
        -> hidden (B, D), memory_1 .. memory_M           (every tensor has B rows)
    step(prev_tokens (N,) int64, hidden (N, D), memory_1 .. memory_M)
        -> log_probs (N, V), hidden (N, D)[, weights (N, S)]

in the model's dtype (float32, or float64 for a float64 model; the manifest's ``dtype``).

`log_probs` is the log-softmax of the step's logits, exactly what `BeamSearch` ranks;
`weights` (the alignment a_ij) is there for attention models only. The memory is the
per-sentence part of what `encode` prepares (annotations, mask, precomputed keys and values);
what every sentence shares (the fused step weight) is a constant of the step program. The step
takes as many memory rows as state rows: a beam of K repeats each sentence's rows K times
(``m.repeat_interleave(K, 0)``), and a sentence that is done is dropped from both.

The programs take S >= 2 (`MIN_SRC_LEN`; traced shapes do not hold at S = 1): `pad_source`
pads a batch of one-token sentences, which changes nothing.

The programs are plain torch ops, the encoder's GRU a `scan` (`bahdanau.encoder`), so
``torch.export.load`` reads them in a process that never imports `bahdanau`.
`bahdanau.serving.decode` is the whole decoding in plain torch, importing torch alone, and
`export_folder` copies it into the folder as ``decode.py``: `greedy_decode` gives the tokens of
`BeamSearch(beam_size=1)` (`translate --beam-size 1`), `beam_decode` those of `BeamSearch`
(n_best 1; `translate`), and ``load_programs`` reads a trusted folder's programs, with torch or,
for the ONNX ones, onnxruntime. Here the two loops raise the library's one-line `InputError` for
NaN scores (`bahdanau.search.refuse_nan_scores`). `ExportedDecoder` makes the programs a model
for `BeamSearch`, so every search of `translate_corpus` runs over them.

`export_folder` writes the programs (``encoder.pt2``, ``step.pt2``, with nothing pickled:
`bahdanau._pt2_archive`), with ``onnx=True`` also as ONNX (``encoder.onnx``, ``step.onnx``:
`bahdanau.serving.onnx_programs`, the onnx extra), the vocabularies, the tokenizer,
``decode.py``, a README and a ``manifest.json`` of the interface and of how the model is built
(its config, or the build record of a model assembled from parts, `bahdanau.parts`) that seals
every file (`bahdanau._sealed`); `load_exported` reads them back as data: it checks the seal
and traces the programs again from that record and the weights, never deserializing a program
(which ``torch.export.load`` does by running what the file says); a class outside bahdanau
that a record names is imported only with ``trust_code`` (or given in ``parts``), as for a
model folder. `bahdanau export` runs `export_folder`.
"""

from bahdanau.serving.folder import (
    DECODE_FILE,
    FILES,
    ONNX_FILES,
    SENTENCEPIECE_FILE,
    ExportedModel,
    check_new_folder,
    export_folder,
    load_exported,
)
from bahdanau.serving.programs import (
    EXPORTED_VERSION,
    MIN_SRC_LEN,
    ExportedDecoder,
    ExportedMemory,
    ServingPrograms,
    beam_decode,
    export_programs,
    greedy_decode,
    pad_source,
)

__all__ = ["DECODE_FILE", "EXPORTED_VERSION", "FILES", "MIN_SRC_LEN", "ONNX_FILES",
           "SENTENCEPIECE_FILE", "ExportedDecoder", "ExportedMemory", "ExportedModel",
           "ServingPrograms", "beam_decode", "check_new_folder", "export_folder",
           "export_programs", "greedy_decode", "load_exported", "pad_source"]
