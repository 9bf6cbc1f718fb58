"""The data pipeline: vocabularies, tokenizers, text files, batches and prepared corpora.

The pieces compose; none owns a loop::

    pairs = read_parallel("train.en.gz", "train.fr.gz")                 # [(src_text, tgt_text)]
    tok = DefaultTokenizer()
    src_vocab = Vocab.build((tok.tokenize(s) for s, _ in pairs), max_size=30000)
    tgt_vocab = Vocab.build((tok.tokenize(t) for _, t in pairs), max_size=30000)
    examples = encode_pairs(pairs, src_vocab, tgt_vocab, tok, max_len=50)
    sampler = BucketBatchSampler(examples, batch_size=80, seed=1234)
    for positions in sampler:
        batch = collate([examples[i] for i in positions])              # Batch of (B, S), (B, T)

* `vocab`: `Vocab` and its `SPECIALS` (pad 0, bos 1, eos 2, unk 3);
* `tokenizers`: the `Tokenizer` protocol, `DefaultTokenizer`, `WhitespaceTokenizer`,
  `CharTokenizer`, `TokenizerPair` (one tokenizer per side; `sides`), and how a tokenizer is
  stored; `sentencepiece`: `SentencePieceTokenizer`;
* `text`: reading line-aligned text (plain or gzip, files and stdin), `read_parallel`, and the
  shipped Multi30k files;
* `batching`: `Example`, `encode_pairs`, `Batch`, `collate`, `pad_to_multiple`,
  `BucketBatchSampler`;
* `corpus`: a corpus prepared once (`prepare_corpus`; where it goes is checked and locked
  before any work by `bahdanau._files.check_destination`), `workers` (the tokenising
  processes, stopped cleanly) and
  `manifest` (the manifest and the digest that seals the folder); `prepared`: the folder
  memory-mapped and checked on open (`PreparedCorpus`).

The special ids are `bahdanau.config`'s (`PAD_ID` ...), which `Vocab` puts its specials at:
`collate` pads and frames with them, and `ModelConfig.check_vocabs` refuses a config that
disagrees (training, loading a checkpoint and translating call it).
"""

from bahdanau.data.batching import (
    Batch,
    BucketBatchSampler,
    Example,
    check_examples,
    collate,
    encode_pairs,
    pad_sources,
    pad_to_multiple,
)
from bahdanau.data.corpus import PreparedCorpus, TrainSentencePiece, prepare_corpus
from bahdanau.data.sentencepiece import SentencePieceTokenizer, check_vocabs
from bahdanau.data.text import (
    MULTI30K_LANGS,
    MULTI30K_SPLITS,
    decode_lines,
    iter_lines,
    multi30k_files,
    normalize_whitespace,
    read_lines,
    read_parallel,
)
from bahdanau.data.tokenizers import (
    CharTokenizer,
    DefaultTokenizer,
    Tokenizer,
    TokenizerPair,
    WhitespaceTokenizer,
    load_tokenizer,
    save_tokenizer,
    sides,
    tokenizer_from_payload,
    tokenizer_to_payload,
)
from bahdanau.data.vocab import SPECIALS, Vocab

__all__ = [
    "MULTI30K_LANGS",
    "MULTI30K_SPLITS",
    "SPECIALS",
    "Batch",
    "BucketBatchSampler",
    "CharTokenizer",
    "DefaultTokenizer",
    "Example",
    "PreparedCorpus",
    "SentencePieceTokenizer",
    "Tokenizer",
    "TokenizerPair",
    "TrainSentencePiece",
    "Vocab",
    "WhitespaceTokenizer",
    "check_examples",
    "check_vocabs",
    "collate",
    "decode_lines",
    "encode_pairs",
    "iter_lines",
    "load_tokenizer",
    "multi30k_files",
    "normalize_whitespace",
    "pad_sources",
    "pad_to_multiple",
    "prepare_corpus",
    "read_lines",
    "read_parallel",
    "save_tokenizer",
    "sides",
    "tokenizer_from_payload",
    "tokenizer_to_payload",
]
