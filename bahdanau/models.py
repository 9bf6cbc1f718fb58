"""RNNSearch and the paper's RNNencdec baseline, assembled from the components.

Both models share `BiRNNEncoder` and `AttentiveDecoder`; they differ only in where the decoder's
context comes from (additive attention vs. a fixed vector), so they compare on equal terms.
"""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor, nn

from bahdanau import functional
from bahdanau._checks import check_dims, check_tensor
from bahdanau.attention import AdditiveAttention
from bahdanau.config import ModelConfig
from bahdanau.decoder import AttentiveDecoder, DecoderMemory
from bahdanau.encoder import BiRNNEncoder
from bahdanau.search import BeamSearch, Hypothesis


class RNNSearch(nn.Module):
    """Encoder-decoder with attention (Bahdanau et al. 2015).

    Args:
        encoder: produces (B, S, 2H) annotations and the (B, S) mask.
        decoder: an `AttentiveDecoder` whose context size is the encoder's output size.
        config: the `ModelConfig` the model was built from (kept for checkpoints), if any.
    """

    arch = "rnnsearch"

    def __init__(self, encoder: BiRNNEncoder, decoder: AttentiveDecoder, *,
                 config: ModelConfig | None = None) -> None:
        super().__init__()
        if encoder.output_size != decoder.context_size:
            raise ValueError(
                f"encoder output size {encoder.output_size} != decoder context_size "
                f"{decoder.context_size}"
            )
        self.encoder, self.decoder, self.config = encoder, decoder, config

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> RNNSearch:
        """Build the model described by `cfg`, with the paper's initialisation."""
        cfg = replace(cfg, arch=cls.arch)
        encoder = BiRNNEncoder(cfg.src_vocab_size, cfg.embed_size, cfg.hidden_size,
                               pad_id=cfg.pad_id, dropout=cfg.dropout, gru_form=cfg.gru_form)
        attention = None
        if cls.arch == "rnnsearch":
            attention = AdditiveAttention(query_size=cfg.decoder_size,
                                          key_size=2 * cfg.hidden_size,
                                          align_size=cfg.align_size, impl=cfg.attention_impl)
        decoder = AttentiveDecoder(cfg.tgt_vocab_size, cfg.embed_size, cfg.decoder_size,
                                   2 * cfg.hidden_size, cfg.maxout_size, attention=attention,
                                   pad_id=cfg.pad_id, dropout=cfg.dropout, gru_form=cfg.gru_form)
        return cls(encoder, decoder, config=cfg)

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, DecoderMemory]:
        """Run the encoder and prepare decoding: returns s_0 (B, D) and the decoder memory."""
        annotations, mask = self.encoder(src, src_lengths)
        return self.decoder.init_state(annotations, mask)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, *,
                return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor | None]:
        """Teacher-forced scores.

        Args:
            src: (B, S) source ids, padded.
            src_lengths: (B,) real source lengths, each in [1, S].
            tgt_in: (B, T) decoder inputs (bos y_1 ... y_{T-1}), padded with pad_id.
            return_attention: also return the (B, T, S) alignment weights (None for RNNencdec).
        Returns:
            (B, T, V) logits of the next target tokens; with `return_attention`, a pair.
        """
        check_tensor("src", src, 2, integer=True)
        check_tensor("tgt_in", tgt_in, 2, integer=True)
        check_dims("forward", [("tgt_in", tgt_in, 0, src.shape[0])])
        state, memory = self.encode(src, src_lengths)
        logits, attention = self.decoder(tgt_in, state, memory, return_attention=return_attention)
        return (logits, attention) if return_attention else logits

    def loss(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor, *,
             label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
        """Summed negative log-likelihood of `tgt_out` given `src`, padding ignored.

        Equal to `functional.sequence_nll(model(src, src_lengths, tgt_in), tgt_out, pad_id)` but
        faster: only the non-pad target positions are projected onto the vocabulary.

        Args:
            src, src_lengths, tgt_in: as for `forward`.
            tgt_out: (B, T) the targets y_1..y_T (tgt_in shifted by one, eos last), pad_id after.
            label_smoothing: 0 (the paper) by default.
        Returns:
            The summed loss (scalar) and the number of target tokens (scalar tensor).
        """
        check_tensor("tgt_out", tgt_out, 2, integer=True)
        check_tensor("tgt_in", tgt_in, 2, integer=True)
        if tgt_out.shape != tgt_in.shape:
            raise ValueError(
                f"tgt_out {tuple(tgt_out.shape)} and tgt_in {tuple(tgt_in.shape)} differ in shape"
            )
        check_dims("loss", [("tgt_in", tgt_in, 0, src.shape[0])])
        select = tgt_out != self.decoder.pad_id
        state, memory = self.encode(src, src_lengths)
        features, _ = self.decoder.features(tgt_in, state, memory, select=select)  # (M, L)
        output = self.decoder.output
        loss = functional.linear_cross_entropy(features, output.weight, output.bias,
                                               tgt_out[select], label_smoothing=label_smoothing)
        return loss, select.sum()

    def translate(self, src: Tensor, src_lengths: Tensor, *, beam_size: int = 5,
                  n_best: int = 1, max_len: int = 100, max_len_ratio: float | None = None,
                  min_len: int = 1, length_penalty: str = "none", alpha: float = 0.6,
                  early_stopping: bool = True) -> list[list[Hypothesis]]:
        """Beam search (`beam_size=1`: greedy) for a padded batch; see `bahdanau.BeamSearch`.

        Returns:
            For each sentence, its `n_best` hypotheses, best first, each with `tokens` (ids
            without bos/eos), `log_prob`, `score` and `attention` ((len(tokens)+1, S), or None
            for RNNencdec).
        """
        search = BeamSearch(beam_size=beam_size, n_best=n_best, max_len=max_len,
                            max_len_ratio=max_len_ratio, min_len=min_len,
                            length_penalty=length_penalty,  # type: ignore[arg-type]
                            alpha=alpha, early_stopping=early_stopping)
        return search(self, src, src_lengths)


class RNNEncDec(RNNSearch):
    """The paper's baseline RNNencdec (Cho et al. 2014a): no attention, a fixed context vector.

    Built from the same `BiRNNEncoder` and `AttentiveDecoder` (with `attention=None`) as
    `RNNSearch`: c = tanh(W_c [fwd h_{T_x}; bwd h_1]) is fed to every GRU update and to the deep
    output. The paper's RNNencdec used a unidirectional encoder and c = tanh(V h_{T_x}); ours uses
    both directions' final states so that only attention differs between the two models.
    """

    arch = "rnnencdec"


def build_model(cfg: ModelConfig) -> RNNSearch:
    """Build `RNNSearch` or `RNNEncDec` according to `cfg.arch`."""
    return (RNNEncDec if cfg.arch == "rnnencdec" else RNNSearch).from_config(cfg)
