"""The exported programs as ONNX, for onnxruntime (``bahdanau export --onnx``; the onnx extra).

`onnx_bytes` converts a `torch.export` program of `bahdanau.serving.export_programs` with
torch's own exporter (``torch.onnx.export(..., dynamo=True)``, which needs ``onnx`` and
``onnxscript``): the same interface, the batch and source length still dynamic, the encoder's
GRU loop (a `scan`) an ONNX ``Scan``. onnxruntime runs the two files to the tokens of the
torch programs (``decode.py``'s `load_programs(runtime="onnx")`; the tests compare greedy and
beam search). The protobuf is written whole, so a model of more than 2 GB of weights (far above
RNNsearch-50's) would need ONNX's external data, which this does not write.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import warnings

import torch
from torch.export import ExportedProgram

from bahdanau.errors import InputError

__all__ = ["ONNX_PACKAGES", "check_onnx", "onnx_bytes"]

# What torch's ONNX exporter imports, and onnxruntime to run the result (the onnx extra).
ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


def check_onnx() -> None:
    """Refuse an ONNX export, before any work, where the onnx extra is not installed.

    Raises:
        InputError: one of `ONNX_PACKAGES` does not import.
    """
    missing = [name for name in ONNX_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise InputError(f"an ONNX export needs {', '.join(missing)}: install the onnx extra "
                         "(pip install 'bahdanau[onnx]'), or export without --onnx")


def onnx_bytes(program: ExportedProgram) -> bytes:
    """`program` as a serialized ONNX model (opset of torch's exporter), its inputs and outputs
    in the program's order."""
    quiet, logger = io.StringIO(), logging.getLogger("torch.onnx")
    level = logger.level          # it logs a warning for each torchvision op it cannot register
    logger.setLevel(logging.ERROR)
    try:                          # and prints its progress
        with warnings.catch_warnings(), contextlib.redirect_stdout(quiet):
            warnings.simplefilter("ignore")
            converted = torch.onnx.export(program, dynamo=True, verbose=False)
    finally:
        logger.setLevel(level)
    if converted is None:                         # never for dynamo=True; the type allows it
        raise InputError("torch.onnx.export gave no program")
    return converted.model_proto.SerializeToString()
