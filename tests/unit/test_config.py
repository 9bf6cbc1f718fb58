"""What a model says of its vocabularies (bahdanau.config.model_vocabs), the one reading of it.

Expectations are written out by hand: a config's sizes and ids as given, and for a model
without a config the sizes of its embeddings and the ids 0..3 (pad, bos, eos, unk).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bahdanau import RNNSearch, presets
from bahdanau.config import ModelConfig, ModelVocabs, model_vocabs


def test_a_model_with_a_config_says_its_configs_sizes_and_ids() -> None:
    config = ModelConfig(src_vocab_size=7, tgt_vocab_size=9, pad_id=3, bos_id=2, eos_id=1,
                         unk_id=0)
    model = SimpleNamespace(config=config, vocab_sizes=(100, 200))   # the config wins
    said = model_vocabs(model)
    assert said == ModelVocabs(src_vocab_size=7, tgt_vocab_size=9, pad_id=3, bos_id=2,
                               eos_id=1, unk_id=0)
    assert said.sizes == (7, 9)


@pytest.mark.parametrize("build", ["parts", "namespace"])
def test_a_model_without_a_config_says_its_vocab_sizes_and_the_default_ids(build) -> None:
    if build == "parts":
        model = RNNSearch.from_config(presets.tiny(11, 13))
        model.config = None                   # as a model assembled from parts: embeddings only
    else:
        model = SimpleNamespace(config=None, vocab_sizes=(11, 13))
    said = model_vocabs(model)
    assert said == ModelVocabs(src_vocab_size=11, tgt_vocab_size=13, pad_id=0, bos_id=1,
                               eos_id=2, unk_id=3)
    assert said.sizes == (11, 13)


@pytest.mark.parametrize("model", [object(), SimpleNamespace(config={"src_vocab_size": 7}),
                                   SimpleNamespace(vocab_sizes=None)])
def test_a_model_with_neither_says_no_sizes_and_has_the_default_ids(model) -> None:
    said = model_vocabs(model)
    assert said == ModelVocabs(src_vocab_size=None, tgt_vocab_size=None, pad_id=0, bos_id=1,
                               eos_id=2, unk_id=3)
    assert said.sizes is None
