r"""BiRNNEncoder: embeddings -> bidirectional GRU -> annotations
$h_j = [\overrightarrow{h}_j; \overleftarrow{h}_j]$ (forward and backward states).

Bahdanau et al. (2015), section 3.2 and appendix A.2.1. Padding is handled exactly: the forward
GRU stops at each sentence's last real token and the backward GRU starts there, so a sentence's
annotations do not depend on how much padding its batch adds. Annotations at padding are 0.

Several paths compute the same annotations, each for one bidirectional layer or a stack of
them (``num_layers``, each layer reading the annotations of the one below):

* eager: `torch.nn.GRU` over a `PackedSequence` (torch form), or one loop over positions that
  keeps each direction's state at padding (paper form);
* layer-normalised (``layer_norm=True``, `bahdanau.layer_norm`): one loop over positions,
  both directions at once, on every path (`BiRNNEncoder._norm_gru`), a `scan` under
  `torch.export`;
* traced (`torch.compile`, `torch.export`): no `PackedSequence`. Each direction is one node
  of the graph over the padded batch, so B and S stay dynamic; the backward direction reads
  each sentence reversed in place by a gather (position j reads len-1-j, padding stays) and is
  gathered back. Under `torch.compile` the node is the registered op
  `torch.ops.bahdanau.gru_layer` (differentiable, for training); under `torch.export` it is a
  `scan` over positions (`_gru_layer_scan`, torch's higher-order loop of plain aten ops), so an
  exported program runs in any torch without `bahdanau`, and converts to ONNX.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._higher_order_ops.scan import scan
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from bahdanau import functional
from bahdanau._checks import (
    check_lengths,
    check_padding,
    check_sizes,
    check_tensor,
    check_token_ids,
)
from bahdanau.config import GRU_FORMS
from bahdanau.errors import InputError
from bahdanau.layer_norm import GateNorm
from bahdanau.parts import Part

# One bidirectional layer's weights: ([W_ih, W_hh, b_ih, b_hh] forward, the same backward).
LayerWeights = tuple[Sequence[Tensor], Sequence[Tensor]]


def _gru_layer(x: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor,
               bias_hh: Tensor, paper: bool, *, train: bool = False) -> Tensor:
    """One GRU direction over every position, left to right from h_0 = 0.

    The torch form runs `torch.nn.GRU`'s kernel; the paper form loops over S with
    `functional.gru_update` (reset gate before U_n).

    Args:
        x: (B, S, E) inputs.
        weight_ih, weight_hh, bias_ih, bias_hh: (3H, E), (3H, H), (3H,), (3H,), one direction of
            `nn.GRU` (gates r, z, n).
        paper: the paper form.
        train: passed to the torch form's kernel (cuDNN keeps what backward needs).
    Returns:
        (B, S, H) the states h_1 .. h_S.
    """
    if not paper:
        h0 = x.new_zeros(1, x.shape[0], weight_hh.shape[1])
        out, _ = torch.ops.aten.gru.input(x, h0, [weight_ih, weight_hh, bias_ih, bias_hh],
                                          True, 1, 0.0, train, False, True)
        return out.contiguous()
    hidden = weight_hh.shape[1]
    x_gates = F.linear(x, weight_ih, bias_ih)                     # (B, S, 3H)
    w_rz, w_n = weight_hh.split([2 * hidden, hidden])
    b_rz, b_n = bias_hh.split([2 * hidden, hidden])
    h = x.new_zeros(x.shape[0], hidden)
    states = []
    for t in range(x.shape[1]):
        h = functional.gru_update(x_gates[:, t], F.linear(h, w_rz, b_rz), h, weight_hn=w_n,
                                  bias_hn=b_n)
        states.append(h)
    return torch.stack(states, dim=1)


def _gru_layer_scan(x: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor,
                    bias_hh: Tensor, paper: bool) -> Tensor:
    """`_gru_layer` as one `scan` over positions, for `torch.export` (no gradients needed).

    Each position runs `functional.gru_update` in the form of `paper`, as the paper form's loop
    does. Traced, the loop is one higher-order node of plain aten ops (S stays dynamic), which
    `torch.export.load` reads without `bahdanau` and `torch.onnx.export` writes as an ONNX
    ``Scan``. Caution: `scan` is a prototype of torch (`torch._higher_order_ops`); the tests
    hold it to `_gru_layer` in float64, both forms, and to eager decoding after export.

    Args and returns: as `_gru_layer`.
    """
    hidden = weight_hh.shape[1]
    x_gates = F.linear(x, weight_ih, bias_ih).transpose(0, 1)         # (S, B, 3H)

    def update(h: Tensor, x_t: Tensor) -> tuple[Tensor, Tensor]:      # (B, H), (B, 3H)
        if paper:       # split here: scan refuses closed-over tensors that alias each other
            w_rz, w_n = weight_hh.split([2 * hidden, hidden])
            b_rz, b_n = bias_hh.split([2 * hidden, hidden])
            h = functional.gru_update(x_t, F.linear(h, w_rz, b_rz), h, weight_hn=w_n,
                                      bias_hn=b_n)
        else:
            h = functional.gru_update(x_t, F.linear(h, weight_hh, bias_hh), h)
        return h, h.clone()                   # the carry and the output: scan forbids aliases

    _, states = scan(update, x.new_zeros(x.shape[0], hidden), x_gates)   # (S, B, H)
    return states.transpose(0, 1)


@torch.library.custom_op("bahdanau::gru_layer", mutates_args=())
def _gru_layer_op(x: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor,
                  bias_hh: Tensor, paper: bool) -> Tensor:
    """`_gru_layer` as one registered op, which tracing keeps whole, so S stays dynamic.

    Tracing `nn.GRU` or the Python loop would unroll the S steps and fix S. Differentiable once:
    the backward recomputes the forward and takes its vector-Jacobian product.
    """
    return _gru_layer(x, weight_ih, weight_hh, bias_ih, bias_hh, paper)


@_gru_layer_op.register_fake
def _(x: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor, bias_hh: Tensor,
      paper: bool) -> Tensor:
    return x.new_empty(x.shape[0], x.shape[1], weight_hh.shape[1])


@torch.library.custom_op("bahdanau::gru_layer_backward", mutates_args=())
def _gru_layer_backward_op(grad: Tensor, x: Tensor, weight_ih: Tensor, weight_hh: Tensor,
                           bias_ih: Tensor, bias_hh: Tensor, paper: bool) -> list[Tensor]:
    """Gradients of `bahdanau::gru_layer` for x and the four weights."""
    def layer(x: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> Tensor:
        return _gru_layer(x, w_ih, w_hh, b_ih, b_hh, paper, train=True)

    vjp = torch.func.vjp(layer, x, weight_ih, weight_hh, bias_ih, bias_hh)[1]
    return [g.contiguous() for g in vjp(grad)]


@_gru_layer_backward_op.register_fake
def _(grad: Tensor, x: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor,
      bias_hh: Tensor, paper: bool) -> list[Tensor]:
    return [t.new_empty(t.shape) for t in (x, weight_ih, weight_hh, bias_ih, bias_hh)]


def _gru_layer_setup(ctx, inputs: tuple, output: Tensor) -> None:
    ctx.save_for_backward(*inputs[:5])
    ctx.paper = inputs[5]


def _gru_layer_grad(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
    grads = _gru_layer_backward_op(grad.contiguous(), *ctx.saved_tensors, ctx.paper)
    return (*grads, None)


_gru_layer_op.register_autograd(_gru_layer_grad, setup_context=_gru_layer_setup)


def init_recurrent_(weight: Tensor, hidden_size: int) -> None:
    """Orthogonal initialisation of each (hidden, hidden) gate block of a (3*hidden, hidden) U."""
    with torch.no_grad():
        for block in weight.split(hidden_size, dim=0):
            nn.init.orthogonal_(block)


class BiRNNEncoder(Part, nn.Module):
    """Bidirectional GRU encoder.

    Args:
        vocab_size: source V.
        embed_size: E.
        hidden_size: H per direction; annotations have 2H features.
        pad_id: padding id (its embedding is kept at 0).
        dropout: dropout on the embeddings (0 in the paper).
        dropout_rnn_inputs: dropout on the GRU's inputs, after `dropout` (the inputs are the
            embeddings, so the two compose: a unit is kept with (1 - p1)(1 - p2)); 0 in the paper.
        gru_form: "torch" uses `torch.nn.GRU` (reset gate applied after U: r * (U h + b)), the
            fast path; "paper" runs the paper's GRU (U (r * h)) in a Python loop over positions,
            both directions at once. See `bahdanau.functional.gru_update`.
        layer_norm: layer-normalised GRUs (`bahdanau.layer_norm`; torch form only): each
            direction's input and recurrent projections normalised apart (`_norm_gru`, a loop
            over positions on every path; the same `nn.GRU` weights, and a `GateNorm` for each
            projection of each direction of each layer in `norms`).
        num_layers: L, bidirectional layers stacked (1 in the paper): layer k + 1 reads layer
            k's annotations, after dropout at the rate of `dropout_rnn_inputs` (as
            `torch.nn.GRU`'s between layers); the annotations are the last layer's.

    Paths: eager calls take the packed path (torch form) or `_paper_gru` (paper form); under
    `torch.compile` and `torch.export`, and with `sync_free=True`, both forms take
    `_padded_gru`, whose shapes do not depend on the lengths' values (traced, each direction is
    one op with no loop over S, so B and S can be dynamic). They agree
    (tested in float64, gradients included). Packed stays the eager default, being faster:
    forward + backward at B=80, S=30, E=H=256 on two CPU threads, about 80 ms packed and
    125 ms padded (`examples/benchmarks/bench_encoder.py`).
    `torch.compile` needs `torch._dynamo.config.patch(allow_rnn=True)` around its calls (dynamo
    refuses to read an `nn.GRU` otherwise; it is only read, never traced). An exported program
    is plain torch: under `torch.export` (non-strict, its default) each direction is a `scan`
    (`_gru_layer_scan`), not the registered op, so it loads and runs without `bahdanau`.

    Value checks (lengths in [1, S] and agreeing with the padding, ids in [0, V)) read tensors
    back to the host, so traced code skips them and keeps the rank, dtype and size checks; call
    `check_inputs` on a batch before a compiled or exported encoder to check it. The encoder is
    its own door for users who call it directly, and a part behind `RNNSearch`'s door, which has
    checked the batch already and passes `check=False` to `forward`.
    """

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, *, pad_id: int = 0,
                 dropout: float = 0.0, dropout_rnn_inputs: float = 0.0,
                 gru_form: str = "torch", layer_norm: bool = False, num_layers: int = 1) -> None:
        super().__init__()
        check_sizes("BiRNNEncoder", num_layers=num_layers)
        if gru_form not in GRU_FORMS:
            raise InputError(f"gru_form must be one of {GRU_FORMS}, got {gru_form!r}")
        if layer_norm and gru_form != "torch":
            raise InputError("layer_norm needs gru_form='torch' (bahdanau.layer_norm)")
        self.vocab_size, self.embed_size, self.hidden_size = vocab_size, embed_size, hidden_size
        self.pad_id, self.gru_form, self.num_layers = pad_id, gru_form, num_layers
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=pad_id)
        self.dropout = nn.Dropout(dropout)
        self.rnn_input_dropout = nn.Dropout(dropout_rnn_inputs)
        # Parameters named as torch.nn.GRU names them, so every path loads the same state dict;
        # its dropout between layers is rnn_input_dropout's, on the inputs of layers 2 to L.
        self.rnn = nn.GRU(embed_size, hidden_size, num_layers=num_layers, batch_first=True,
                          bidirectional=True, dropout=dropout_rnn_inputs if num_layers > 1 else 0.0)
        # LN of [forward W x, forward U h, backward W x, backward U h] of each layer in turn;
        # None: no layer norm
        self.norms = (nn.ModuleList(GateNorm(hidden_size) for _ in range(4 * num_layers))
                      if layer_norm else None)
        self.reset_parameters()

    @property
    def output_size(self) -> int:
        """2H, the size of an annotation."""
        return 2 * self.hidden_size

    def reset_parameters(self) -> None:
        """The paper's initialisation: U orthogonal, other weights N(0, 0.01^2), biases 0."""
        nn.init.normal_(self.embedding.weight, std=0.01)
        with torch.no_grad():
            self.embedding.weight[self.pad_id].zero_()
        for name, param in self.rnn.named_parameters():
            if name.startswith("weight_hh"):
                init_recurrent_(param, self.hidden_size)
            elif name.startswith("weight_ih"):
                nn.init.normal_(param, std=0.01)
            else:
                nn.init.zeros_(param)
        for module in self.modules():
            if isinstance(module, GateNorm):
                module.reset_parameters()

    def forward(self, src: Tensor, src_lengths: Tensor, *, check: bool = True,
                sync_free: bool = False) -> tuple[Tensor, Tensor]:
        """Encode a padded batch.

        Args:
            src: (B, S) source token ids, padded after each sentence's end.
            src_lengths: (B,) number of real tokens per sentence, each in [1, S].
            check: run the value checks of `check_inputs` (lengths in [1, S] and agreeing with
                the padding, ids in [0, V)), which read the tensors (a device sync). The flag
                stays because the encoder is both a door and a part: a model that has checked
                the batch at its own door (`RNNSearch.check_batch`) passes False. Ranks, dtypes
                and sizes are checked either way; traced code (`torch.compile`, `torch.export`)
                never runs the value checks.
            sync_free: read nothing back to the host, as traced code does: no value checks and
                the padded path (`_padded_gru`), whose shapes do not depend on the lengths'
                values, so a CUDA graph of it replays for any lengths
                (`bahdanau.training.update.SyncFreeUpdate`).
        Returns:
            (B, S, 2H) annotations h_j (0 at padding) and the (B, S) bool mask, True at real tokens.
        Raises:
            InputError: wrong ranks, dtypes or sizes, an empty batch; with `check`, empty
                sentences, lengths beyond S or disagreeing with the padding, ids outside V.
        """
        padded = sync_free or torch.compiler.is_compiling()
        self._check(src, src_lengths, values=check and not padded)
        lengths = src_lengths.to(src.device)
        mask = functional.lengths_to_mask(lengths, src.shape[1])
        embedded = self.rnn_input_dropout(self.dropout(self.embedding(src)))   # (B, S, E)
        if self.norms is not None:                 # no host reads: every path
            return self._norm_gru(embedded, mask), mask
        if padded:
            return self._padded_gru(embedded, lengths, mask), mask
        if self.gru_form == "paper":
            return self._paper_gru(embedded, mask), mask
        return self._packed_gru(embedded, src_lengths), mask

    def check_inputs(self, src: Tensor, src_lengths: Tensor) -> None:
        """Every check of `forward`, the value checks included (they read the tensors).

        Args:
            src: (B, S) source token ids.
            src_lengths: (B,) number of real tokens per sentence.
        Raises:
            InputError: wrong ranks or dtypes, an empty batch, empty sentences, lengths beyond
                S or disagreeing with the padding, ids outside V.
        """
        self._check(src, src_lengths, values=True)

    def _check(self, src: Tensor, src_lengths: Tensor, *, values: bool) -> None:
        """Ranks, dtypes and sizes; with `values` also the checks that read the tensors (no host
        reads in a traced graph)."""
        check_tensor("src", src, 2, integer=True)
        check_lengths("src_lengths", src_lengths, src.shape[0], src.shape[1], values=values)
        if values:
            check_token_ids("src", src, self.vocab_size)          # padding is embedded too
            check_padding("src", src, src_lengths, self.pad_id)

    def _packed_gru(self, embedded: Tensor, src_lengths: Tensor) -> Tensor:
        """Torch form over a `PackedSequence`, which skips padding: (B, S, E) -> (B, S, 2H)."""
        src_len = embedded.shape[1]
        lengths = src_lengths.cpu()
        if bool((lengths == src_len).all()):
            annotations, _ = self.rnn(embedded)                   # no padding at all
            return annotations
        packed = pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        annotations, _ = pad_packed_sequence(out, batch_first=True, total_length=src_len)
        return annotations

    def _padded_gru(self, embedded: Tensor, lengths: Tensor, mask: Tensor) -> Tensor:
        """Either form without a `PackedSequence`, traceable with dynamic B and S.

        Each direction runs every position of the padded batch; the forward direction's states
        past a sentence's end are dropped, and the backward direction runs left to right over
        each sentence reversed in place (position j < len reads len-1-j, padding stays), the same
        gather putting its states back.

        Args:
            embedded: (B, S, E) embedded source.
            lengths: (B,) lengths, on the device of `embedded`.
            mask: (B, S) True at real tokens.
        Returns:
            (B, S, 2H) annotations, 0 at padding.
        """
        paper, compiling = self.gru_form == "paper", torch.compiler.is_compiling()
        exporting = torch.compiler.is_exporting()

        def layer(x: Tensor, weights: Sequence[Tensor]) -> Tensor:
            w_ih, w_hh, b_ih, b_hh = weights
            if exporting:                      # one loop of aten ops: runs without bahdanau
                return _gru_layer_scan(x, w_ih, w_hh, b_ih, b_hh, paper)
            if compiling:                      # one op in the graph, S stays dynamic
                return _gru_layer_op(x, w_ih, w_hh, b_ih, b_hh, paper)
            # eager: autograd's own backward, without the op's recomputation
            return _gru_layer(x, w_ih, w_hh, b_ih, b_hh, paper, train=torch.is_grad_enabled())

        positions = torch.arange(embedded.shape[1], device=embedded.device)
        flip = torch.where(mask, lengths[:, None] - 1 - positions, positions)[..., None]

        def both_directions(x: Tensor, _: int, weights: LayerWeights) -> Tensor:
            fwd = layer(x, weights[0])                                          # (B, S, H)
            bwd = layer(x.gather(1, flip.expand_as(x)), weights[1])
            bwd = bwd.gather(1, flip.expand_as(bwd))                            # (B, S, H)
            return torch.cat([fwd, bwd], dim=-1).masked_fill(~mask[..., None], 0.0)

        return self._stacked(embedded, both_directions)

    def _stacked(self, embedded: Tensor,
                 layer: Callable[[Tensor, int, LayerWeights], Tensor]) -> Tensor:
        """`layer` (a layer's input, its index, its weights -> its (B, S, 2H) annotations) run
        over the stack, first to last: layer k + 1 reads layer k's annotations after
        `rnn_input_dropout`, the rate of `torch.nn.GRU`'s dropout between layers in the packed
        path, so every path is the same function."""
        weights = self.rnn.all_weights             # [W_ih, W_hh, b_ih, b_hh], per layer: fwd, bwd
        x = embedded                                                 # (B, S, E), then (B, S, 2H)
        for k in range(self.num_layers):
            x = self.rnn_input_dropout(x) if k else x
            x = layer(x, k, (weights[2 * k], weights[2 * k + 1]))
        return x

    def _paper_gru(self, embedded: Tensor, mask: Tensor) -> Tensor:
        """The paper's GRU, layer after layer: (B, S, E) -> (B, S, 2H), 0 at padding."""
        return self._stacked(embedded, lambda x, _, weights: self._paper_layer(x, mask, weights))

    def _paper_layer(self, x: Tensor, mask: Tensor, weights: LayerWeights) -> Tensor:
        """Both directions of one layer of the paper's GRU in one loop (fwd at position t, bwd
        at S-1-t)."""
        hidden = self.hidden_size
        batch, src_len, _ = x.shape
        (w_ih, w_hh, b_ih, b_hh), (w_ih_r, w_hh_r, b_ih_r, b_hh_r) = weights
        x_fwd = nn.functional.linear(x, w_ih, b_ih)                        # (B, S, 3H)
        x_bwd = nn.functional.linear(x, w_ih_r, b_ih_r)                    # (B, S, 3H)
        w_rz = torch.stack([w_hh[: 2 * hidden], w_hh_r[: 2 * hidden]])     # (2, 2H, H)
        b_rz = torch.stack([b_hh[: 2 * hidden], b_hh_r[: 2 * hidden]])     # (2, 2H)
        w_n = (w_hh[2 * hidden:], w_hh_r[2 * hidden:])
        b_n = (b_hh[2 * hidden:], b_hh_r[2 * hidden:])
        h = x.new_zeros(2, batch, hidden)                         # (2, B, H) fwd, bwd
        outputs: list[list[Tensor]] = [[], []]
        for t in range(src_len):
            h_gates = torch.baddbmm(b_rz[:, None], h, w_rz.transpose(1, 2))  # (2, B, 2H)
            new = []
            for d, x_t in ((0, x_fwd[:, t]), (1, x_bwd[:, src_len - 1 - t])):
                real = mask[:, t if d == 0 else src_len - 1 - t, None]
                h_d = functional.gru_update(x_t, h_gates[d], h[d], weight_hn=w_n[d],
                                            bias_hn=b_n[d])
                h_d = torch.where(real, h_d, h[d])                # padding keeps the state
                outputs[d].append(torch.where(real, h_d, torch.zeros_like(h_d)))
                new.append(h_d)
            h = torch.stack(new)
        fwd = torch.stack(outputs[0], dim=1)                       # (B, S, H)
        bwd = torch.stack(outputs[1][::-1], dim=1)                 # (B, S, H)
        return torch.cat([fwd, bwd], dim=-1)

    def _norm_gru(self, embedded: Tensor, mask: Tensor) -> Tensor:
        """The layer-normalised GRU, layer after layer: (B, S, E) -> (B, S, 2H), 0 at padding."""
        return self._stacked(embedded, lambda x, k, weights: self._norm_layer(x, mask, k, weights))

    def _norm_layer(self, x: Tensor, mask: Tensor, layer: int, weights: LayerWeights) -> Tensor:
        """Both directions of one layer of the layer-normalised GRU in one loop (fwd at position
        t, bwd at S-1-t), each direction's state kept at padding: (B, S, in) -> (B, S, 2H).

        Eager, the loop is Python's; under `torch.export` it is one `scan` of the same
        `position` function (S stays dynamic, as `_gru_layer_scan`)."""
        assert self.norms is not None
        norms = self.norms[4 * layer: 4 * layer + 4]
        inputs, recurrent = [], []
        for d, (w_ih, w_hh, b_ih, b_hh) in enumerate(weights):
            x_gates = norms[2 * d](F.linear(x, w_ih, b_ih)).transpose(0, 1)
            inputs.append(x_gates if d == 0 else x_gates.flip(0))         # (S, B, 3H)
            recurrent.append((w_hh, b_hh, norms[2 * d + 1]))
        real = mask.transpose(0, 1)[..., None]                             # (S, B, 1)
        inputs += [real, real.flip(0)]

        def position(h: tuple[Tensor, Tensor], x: list[Tensor]
                     ) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
            states, outputs = [], []
            for d, (w_hh, b_hh, h_norm) in enumerate(recurrent):
                new = functional.gru_update(x[d], h_norm(F.linear(h[d], w_hh, b_hh)), h[d])
                states.append(torch.where(x[2 + d], new, h[d]))         # padding keeps the state
                outputs.append(torch.where(x[2 + d], new, torch.zeros_like(new)))
            return (states[0], states[1]), (outputs[0], outputs[1])

        h0 = inputs[0].new_zeros(x.shape[0], self.hidden_size)          # autocast: the gates'
        if torch.compiler.is_exporting():
            _, (fwd, bwd) = scan(position, (h0, h0.clone()), inputs)      # (S, B, H) each
        else:
            h, steps = (h0, h0), []
            for t in range(x.shape[1]):
                h, out = position(h, [step[t] for step in inputs])
                steps.append(out)
            fwd, bwd = (torch.stack(direction) for direction in zip(*steps, strict=True))
        return torch.cat([fwd, bwd.flip(0)], dim=-1).transpose(0, 1)     # (B, S, 2H)
