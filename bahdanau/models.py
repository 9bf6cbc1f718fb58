"""RNNSearch and the paper's RNNencdec baseline, assembled from the components.

Both models share `BiRNNEncoder` and `AttentiveDecoder`; they differ only in where the decoder's
context comes from (additive attention vs. a fixed vector), so they compare on equal terms.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from bahdanau import functional
from bahdanau._checks import (
    check_dims,
    check_end_padding,
    check_lengths,
    check_padding,
    check_tensor,
    check_token_ids,
    check_type,
)
from bahdanau.attention import AdditiveAttention, LuongAttention
from bahdanau.conditional_decoder import ConditionalGRUDecoder
from bahdanau.config import ENGINES, EOS_ID, Arch, ModelConfig
from bahdanau.decoder import AttentiveDecoder, DecoderState, StepOutput
from bahdanau.encoder import BiRNNEncoder
from bahdanau.engine import fast_twin
from bahdanau.errors import InputError
from bahdanau.layer_norm import reset_gate_norms_
from bahdanau.model_folder import Pretrained
from bahdanau.parts import Part
from bahdanau.search import BeamSearch, Hypothesis, LengthPenalty


class RNNSearch(Part, Pretrained, nn.Module):
    """Encoder-decoder with attention (Bahdanau et al. 2015).

    The model is the door where a batch's values are checked, once: `forward`, `loss` and
    `encode` (and so `translate` and `bahdanau.BeamSearch`) run `check_batch` on what they are
    given, in eager code, and their parts (encoder, decoder, engine, attention) then trust the
    batch and check ranks and sizes at most.

    Args:
        encoder: produces (B, S, 2H) annotations and the (B, S) mask.
        decoder: an `AttentiveDecoder` whose context size is the encoder's output size.
        engine: "fast" (decoding and training through the decoder's twin in `bahdanau.engine`,
            the same function computed faster: `DecoderEngine` for the paper's decoder,
            `ConditionalEngine` for the conditional GRU; a decoder whose `has_fast_twin` is False
            takes the reference path) or "reference" (the decoder alone).
        config: the `ModelConfig` the model was built from (kept for checkpoints), if any.

    `save_pretrained` writes the model as a folder of its own and `from_pretrained` reads it
    back (`bahdanau.model_folder.Pretrained`: a preset's model by its config, one assembled
    from parts by its parts' record).
    """

    arch: ClassVar[Arch] = "rnnsearch"

    def __init__(self, encoder: BiRNNEncoder, decoder: AttentiveDecoder, *,
                 engine: str = "fast", config: ModelConfig | None = None) -> None:
        super().__init__()
        if encoder.output_size != decoder.context_size:
            raise InputError(
                f"encoder output size {encoder.output_size} != decoder context_size "
                f"{decoder.context_size}"
            )
        if engine not in ENGINES:
            raise InputError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.encoder, self.decoder, self.config = encoder, decoder, config
        # "fast" where the decoder has a twin (`bahdanau.engine.fast_twin`); a decoder whose
        # `has_fast_twin` is False takes the reference path
        self.engine = fast_twin(decoder) if engine == "fast" else None
        # Resolved once: an encoder of the user's own needs neither `check_inputs` (the model
        # then checks the lengths against the padding itself) nor a `check` argument (which
        # lets the model skip the value checks it has made at its door).
        self._encoder_checks = callable(getattr(encoder, "check_inputs", None))
        encoder_args = inspect.signature(encoder.forward).parameters
        self._encoder_takes_check = "check" in encoder_args
        self._encoder_takes_sync_free = "sync_free" in encoder_args

    @property
    def int8(self) -> bool:
        """Whether its searches multiply the big step matmuls in int8 (an `int8_copy`)."""
        return self.engine is not None and self.engine.int8 is not None

    def int8_copy(self) -> RNNSearch:
        """A copy of the model, in eval mode, whose searches multiply the fused step weight,
        U_o, V_o and W_o in int8 on the CPU's int8 units (`DecoderEngine(int8=True)`): quantised
        once, now, per output channel (`bahdanau.kernels.int8_linear`). For decoding only:
        `bahdanau.train_step` refuses it, and its teacher forcing (`forward`, `loss`) is the
        float model's. The model itself is left as it is.

        Raises:
            InputError: a model without the fast engine (`engine="reference"`, or a decoder
                with no fast twin), weights that are not float32 on a CPU, or a machine where int8
                matmuls cannot run (`bahdanau.kernels.int8_linear.unavailable_reason`).
        """
        if self.engine is None:
            raise InputError("int8 decoding runs through the fast engine; this model decodes "
                             "through the reference decoder (engine='reference', or a decoder "
                             "with no fast twin): decode it in float32")
        model = copy.deepcopy(self).eval()
        model.engine = type(self.engine)(model.decoder,
                                         sequence_grads=self.engine.sequence_grads, int8=True)
        return model

    @property
    def vocab_sizes(self) -> tuple[int, int]:
        """(source V, target V): the sizes of the embeddings, with or without a `config`."""
        return self.encoder.embedding.num_embeddings, self.decoder.vocab_size

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> RNNSearch:
        """Build the model described by `cfg`, initialised as `cfg.init` says (the paper's by
        default, see `glorot_init_`)."""
        check_type("cfg", cfg, ModelConfig, "a ModelConfig")
        cfg = replace(cfg, arch=cls.arch)
        encoder = BiRNNEncoder(cfg.src_vocab_size, cfg.embed_size, cfg.hidden_size,
                               pad_id=cfg.pad_id, dropout=cfg.dropout,
                               dropout_rnn_inputs=cfg.dropout_rnn_inputs, gru_form=cfg.gru_form,
                               layer_norm=cfg.layer_norm, num_layers=cfg.encoder_layers)
        attention = None
        if cls.arch == "rnnsearch":
            attention = _attention(cfg)
        decoder_class = ConditionalGRUDecoder if cfg.decoder == "cgru" else AttentiveDecoder
        decoder = decoder_class(cfg.tgt_vocab_size, cfg.embed_size, cfg.decoder_size,
                                   2 * cfg.hidden_size, cfg.maxout_size, attention=attention,
                                   pad_id=cfg.pad_id, dropout=cfg.dropout,
                                   dropout_rnn_inputs=cfg.dropout_rnn_inputs,
                                   dropout_deep_output=cfg.dropout_deep_output,
                                   gru_form=cfg.gru_form, layer_norm=cfg.layer_norm)
        model = cls(encoder, decoder, engine=cfg.engine, config=cfg)
        if cfg.init == "glorot":
            glorot_init_(model)
        return model

    def encode(self, src: Tensor, src_lengths: Tensor, *, check: bool = True
               ) -> tuple[DecoderState, Any]:
        """Run the encoder and prepare decoding: the (B rows) state s_0 and the memory that
        `step` takes (`DecoderMemory`, or the engine's `EngineMemory`). What `BeamSearch` calls.

        Args:
            src, src_lengths: as for `forward`.
            check: run the value checks of the source (`check_batch(src, src_lengths)`) first,
                in eager code. `encode` is the model's one entry point with this flag, being a part
                of a larger door: an `Ensemble` checks its source once, through its first
                member, and passes False to the others. Ranks and sizes are checked either way.
        Raises:
            InputError: see `check_batch`.
        """
        if check:
            self._check_at_door(src, src_lengths)
        return self._encode(src, src_lengths, for_search=True)

    def _encode(self, src: Tensor, src_lengths: Tensor, *, for_search: bool = False,
                sync_free: bool = False) -> tuple[DecoderState, Any]:
        """`encode` of a batch whose values are checked (the door has run `check_batch`);
        `for_search`: the memory will be stepped (`DecoderEngine.prepare`); `sync_free`: the
        encoder's path that reads nothing back to the host, where it has one."""
        if self._encoder_takes_sync_free and sync_free:
            annotations, mask = self.encoder(src, src_lengths, check=False, sync_free=True)
        elif self._encoder_takes_check:
            annotations, mask = self.encoder(src, src_lengths, check=False)
        else:
            annotations, mask = self.encoder(src, src_lengths)
        state, memory = self.decoder.init_state(annotations, mask)
        if self.engine is None:
            return state, memory
        return state, self.engine.prepare(memory, for_search=for_search)

    def _check_at_door(self, *batch: Tensor) -> None:
        """`check_batch(*batch)` in eager code; traced code (`torch.compile`, `torch.export`)
        skips it, as its value checks read tensors back to the host."""
        if not torch.compiler.is_compiling():
            self.check_batch(*batch)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Any, *,
             check: bool = True) -> StepOutput:
        """One decoder step for N rows from `encode`'s memory (what `BeamSearch` calls).

        Args:
            prev_tokens: (N,) y_{i-1}, ids in [0, V).
            state: (N, D) s_{i-1} (`DecoderState`), from `encode` or the previous step.
            memory: `encode`'s memory of the B sentences (N is B, or B*K beams).
            check: check the values of `prev_tokens` (one read of them back to the host). A
                search that takes its tokens from the model's own vocabulary passes False, so
                its steps read nothing back (`BeamSearch` does). Ranks and sizes are checked
                either way.
        Returns:
            `StepOutput`: (N, V) logits, the next state, (N, S) weights (None for RNNencdec).
        Raises:
            InputError: tokens of the wrong rank, dtype or (with `check`) value, or a state of
                the wrong shape (cheap checks at this door: no read of the token ids under
                `torch.compile`).
        """
        self._check_step(prev_tokens, state, values=check)
        if self.engine is None:
            return self.decoder.step(prev_tokens, state, memory)
        return self.engine.step(prev_tokens, state, memory)

    def _check_step(self, prev_tokens: Tensor, state: DecoderState, *, values: bool) -> None:
        check_tensor("prev_tokens", prev_tokens, 1, integer=True)
        hidden = getattr(state, "hidden", None)
        if not isinstance(hidden, Tensor):
            raise InputError(f"state must be the DecoderState that encode() or step() returned, "
                             f"got {type(state).__name__}")
        expected = (prev_tokens.shape[0], self.decoder.hidden_size)
        if tuple(hidden.shape) != expected:
            raise InputError(f"state.hidden has shape {tuple(hidden.shape)}, expected {expected}: "
                             "one row of size D per token of prev_tokens")
        if values and not torch.compiler.is_compiling():
            check_token_ids("prev_tokens", prev_tokens, self.decoder.vocab_size)

    def check_batch(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor | None = None,
                    tgt_out: Tensor | None = None) -> None:
        """Every check of `forward` and `loss` on a batch, the value checks included.

        The value checks (lengths in [1, S] and agreeing with the padding, so no row is all
        padding; ids in the vocabularies; targets padded only at the end, a real input for every
        target, nothing but padding after a target's eos) read the tensors' contents, a device
        sync. In eager mode `forward`, `loss` and `encode` (so `translate` and `BeamSearch`) run
        this once per batch, at the door; the parts behind it check ranks and sizes at most.
        Under `torch.compile` and `torch.export` the value checks stay out of the graph: code that
        calls a compiled or exported model calls this first, once per batch, in eager code.

        Raises:
            InputError: naming the tensor and the problem.
        """
        self._check_source(src, src_lengths)
        for name, ids in (("tgt_in", tgt_in), ("tgt_out", tgt_out)):
            if ids is not None:
                check_tensor(name, ids, 2, integer=True)
                check_dims("check_batch", [(name, ids, 0, src.shape[0])])
                check_token_ids(name, ids, self.decoder.vocab_size)
        if tgt_in is not None and tgt_out is not None:
            _check_same_shape(tgt_in, tgt_out)
        if tgt_in is not None:
            self._check_target_padding(tgt_in, tgt_out)
        if tgt_out is not None:
            self._check_nothing_after_eos(tgt_out)

    def _check_target_padding(self, tgt_in: Tensor, tgt_out: Tensor | None) -> None:
        """Targets are real tokens then padding, at least one per row, and every scored
        position of tgt_out has a real input in tgt_in (tgt_in may run one longer, with eos as
        its last input, as in the common `full[:, :-1]`, `full[:, 1:]` split)."""
        if tgt_in.shape[1] == 0:
            raise InputError(f"tgt_in has shape {tuple(tgt_in.shape)}: no target positions")
        pad_id = self.decoder.pad_id
        inputs = check_end_padding("tgt_in", tgt_in, pad_id)                     # (B,)
        if tgt_out is None:
            return
        targets = check_end_padding("tgt_out", tgt_out, pad_id)                  # (B,)
        short = targets > inputs
        if bool(short.any()):
            row = int(torch.nonzero(short)[0])
            raise InputError(f"tgt_out row {row} has {int(targets[row])} targets but tgt_in "
                             f"only {int(inputs[row])} inputs: a target at a padded input")

    def _check_nothing_after_eos(self, tgt_out: Tensor) -> None:
        """A target sentence ends at its first eos: only padding may follow it (a token there
        would be trained on as part of the sentence, which decoding never continues)."""
        eos_id = EOS_ID if self.config is None else self.config.eos_id
        is_eos = (tgt_out == eos_id).int()
        after_eos = (is_eos.cumsum(dim=1) - is_eos > 0) & (tgt_out != self.decoder.pad_id)
        if bool(after_eos.any()):
            row, pos = (int(i) for i in torch.nonzero(after_eos)[0])
            raise InputError(f"tgt_out row {row} has token {int(tgt_out[row, pos])} at position "
                             f"{pos}, after its eos (={eos_id}): a sentence ends at its eos, "
                             "only padding may follow")

    def _check_source(self, src: Tensor, src_lengths: Tensor) -> None:
        """The encoder's `check_inputs`, or, for an encoder without one, lengths in [1, S]
        that agree with the padding."""
        if self._encoder_checks:
            self.encoder.check_inputs(src, src_lengths)
            return
        check_tensor("src", src, 2, integer=True)
        check_lengths("src_lengths", src_lengths, src.shape[0], src.shape[1])
        check_padding("src", src, src_lengths, self.decoder.pad_id)

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
        Raises:
            InputError: see `check_batch`.
        """
        self._check_at_door(src, src_lengths, tgt_in)
        state, memory = self._encode(src, src_lengths)
        if self.engine is None:
            logits, attention = self.decoder(tgt_in, state, memory,
                                             return_attention=return_attention)
        else:
            features, attention = self.engine.features(tgt_in, state, memory,
                                                       return_attention=return_attention)
            logits = self.decoder.output(features)
        return (logits, attention) if return_attention else logits

    def loss(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor, *,
             label_smoothing: float = 0.0, sync_free: bool = False) -> tuple[Tensor, Tensor]:
        """Summed negative log-likelihood of `tgt_out` given `src`, padding ignored.

        Equal to `functional.sequence_nll(model(src, src_lengths, tgt_in), tgt_out, pad_id)`,
        which the reference engine computes; the fast engine projects only the non-pad target
        positions onto the vocabulary (`DecoderEngine.loss`).

        Args:
            src, src_lengths, tgt_in: as for `forward`.
            tgt_out: (B, T) the targets y_1..y_T (tgt_in shifted by one, eos last), pad_id after.
            label_smoothing: 0 (the paper) by default.
            sync_free: read nothing back to the host, so that a CUDA graph of the loss replays
                for any batch of the same shape: no value checks (call `check_batch` on the
                batch first), the encoder's padded path and every target position through the
                loss (padding ignored by its index). The same loss, computed on fixed shapes.
        Returns:
            The summed loss (scalar) and the number of target tokens (scalar tensor).
        Raises:
            InputError: see `check_batch` (only ranks and sizes with `sync_free`).
        """
        check_tensor("tgt_out", tgt_out, 2, integer=True)
        check_tensor("tgt_in", tgt_in, 2, integer=True)
        _check_same_shape(tgt_in, tgt_out)
        if not sync_free:
            self._check_at_door(src, src_lengths, tgt_in, tgt_out)
        state, memory = self._encode(src, src_lengths, sync_free=sync_free)
        if self.engine is not None:
            return self.engine.loss(tgt_in, tgt_out, state, memory,
                                    label_smoothing=label_smoothing, every_position=sync_free)
        logits, _ = self.decoder(tgt_in, state, memory)
        return functional.sequence_nll(logits, tgt_out, self.decoder.pad_id,
                                       label_smoothing=label_smoothing)

    def translate(self, src: Tensor, src_lengths: Tensor, *, beam_size: int = 5,
                  n_best: int = 1, max_len: int = 100, max_len_ratio: float | None = None,
                  min_len: int = 1, length_penalty: LengthPenalty = "none", alpha: float = 0.6,
                  early_stopping: bool = True, check_every: int = 1, cuda_graphs: bool = False,
                  observe: Callable[[int, float], None] | None = None,
                  constraints: Sequence[Sequence[Sequence[int]]] | None = None,
                  avoid: Sequence[Sequence[Sequence[int]]] | None = None
                  ) -> list[list[Hypothesis]]:
        """Beam search (`beam_size=1`: greedy) for a padded batch; see `bahdanau.BeamSearch`.

        Args:
            src, src_lengths: as for `forward`.
            beam_size, n_best, max_len, max_len_ratio, min_len, length_penalty, alpha,
                early_stopping, check_every, cuda_graphs, observe: the settings of
                `bahdanau.BeamSearch` (a search of its own keeps its CUDA graphs between
                batches; this one records them for each call).
            constraints, avoid: optional, one list of phrases (lists of target ids) per
                sentence that every hypothesis holds, or none holds (`bahdanau.constraints`).
        Returns:
            For each sentence, its `n_best` hypotheses, best first, each with `tokens` (ids
            without bos/eos), `log_prob`, `score` and `attention` ((len(tokens)+1, S), or None
            for RNNencdec).
        Raises:
            InputError: a bad search setting or phrase (`BeamSearch.__call__`), or see
                `check_batch`.
        """
        search = BeamSearch(beam_size=beam_size, n_best=n_best, max_len=max_len,
                            max_len_ratio=max_len_ratio, min_len=min_len,
                            length_penalty=length_penalty, alpha=alpha,
                            early_stopping=early_stopping, check_every=check_every,
                            cuda_graphs=cuda_graphs, observe=observe)
        return search(self, src, src_lengths, constraints=constraints,  # checked by `encode`
                      avoid=avoid)


class RNNEncDec(RNNSearch):
    r"""The paper's baseline RNNencdec (Cho et al. 2014a): no attention, a fixed context vector.

    Built from the same `BiRNNEncoder` and `AttentiveDecoder` (with `attention=None`) as
    `RNNSearch`: $c = \tanh(W_c [\overrightarrow{h}_{T_x}; \overleftarrow{h}_1])$ is fed to every
    GRU update and to the deep output. The paper's RNNencdec used a unidirectional encoder and
    $c = \tanh(V h_{T_x})$; ours uses both directions' final states so that only attention
    differs between the two models.
    """

    arch = "rnnencdec"


def _check_same_shape(tgt_in: Tensor, tgt_out: Tensor) -> None:
    """tgt_out is tgt_in shifted by one: the two must have the same (B, T) shape."""
    if tgt_out.shape != tgt_in.shape:
        raise InputError(
            f"tgt_out {tuple(tgt_out.shape)} and tgt_in {tuple(tgt_in.shape)} differ in shape"
        )


def _attention(cfg: ModelConfig) -> AdditiveAttention | LuongAttention:
    """The attention `cfg.attention` names, sized for the model."""
    if cfg.attention == "additive":
        return AdditiveAttention(query_size=cfg.decoder_size, key_size=2 * cfg.hidden_size,
                                 align_size=cfg.align_size, impl=cfg.attention_impl)
    return LuongAttention(cfg.decoder_size, 2 * cfg.hidden_size,
                          form=cfg.attention.removeprefix("luong_"))


def glorot_init_(model: nn.Module) -> None:
    r"""Glorot and Bengio's (2010) initialisation, `ModelConfig(init="glorot")`: every weight
    matrix (embeddings, recurrent and attention matrices included) $\sim U(-a, a)$ with
    $a = \sqrt{6 / (\text{fan-in} + \text{fan-out})}$, every vector (biases, $v_a$) 0,
    pad embedding rows 0.

    The paper's initialisation (the default) draws matrices from $\mathcal{N}(0, 0.01^2)$, the
    alignment matrices from $\mathcal{N}(0, 0.001^2)$ and the recurrent ones orthogonal; this is
    the common choice of toolkits (OpenNMT-py's `param_init_glorot`) instead. Layer norms
    (`bahdanau.layer_norm`) keep gain 1 and shift 0.
    """
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                nn.init.xavier_uniform_(param)
            else:
                param.zero_()
        for module in model.modules():
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
    reset_gate_norms_(model)                # layer norms' gains 1 (a vector drawn as 0 above)


def model_class(cfg: ModelConfig) -> type[RNNSearch]:
    """The class `build_model` builds for `cfg`: `RNNEncDec` or `RNNSearch`, by `cfg.arch`."""
    return RNNEncDec if cfg.arch == "rnnencdec" else RNNSearch


def build_model(cfg: ModelConfig) -> RNNSearch:
    """Build `RNNSearch` or `RNNEncDec` according to `cfg.arch`."""
    check_type("cfg", cfg, ModelConfig, "a ModelConfig (e.g. bahdanau.presets.small(V_src, V_tgt))")
    return model_class(cfg).from_config(cfg)
