"""Gradients of tensors reused at every decoder step, summed once per sequence.

In teacher forcing the decoder applies two per-batch tensors at every target step i: the fused
step weight W = [W_a; U] (with its bias) to s_{i-1}, and the precomputed values
V_b = [C; C_o] h_bj, mixed by the weights a_i. Under plain autograd every step's backward builds
a full-size gradient for each and adds it to a running sum: T matmuls of only B rows for dW and
T (B, S, M) outer products for dV, each followed by a read-modify-write of the sum. Here a step's
backward returns only what the recurrence needs (ds_{i-1} = g_i W, da_i = dc_i V^T) and records
its factors; once every step is done, one matmul over the stacked steps gives each gradient:

    dW = sum_i g_i^T s_{i-1} = G^T S        db = sum_i g_i        dV_b = sum_i a_bi^T dc_bi

The sums are the same; only their order differs (rounding in the last bits). Every step takes a
scalar token produced from W, b and V, so autograd runs the final summation after all the steps'
backward functions. Differentiable once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class SequenceGrads:
    """The step projection and the value mix of one teacher-forced sequence batch.

    Args:
        weight: (P, D) the step weight, applied as `F.linear(state, weight, bias)`.
        bias: (P,) its bias.
        values: (B, S, M) what the attention weights mix, or None to leave mixing to the caller.
    """

    def __init__(self, weight: Tensor, bias: Tensor, values: Tensor | None) -> None:
        self.weight, self.bias, self.values = weight, bias, values
        self.step_grads: list[Tensor] = []       # g_i, (N, P)
        self.step_inputs: list[Tensor] = []      # s_{i-1}, (N, D)
        self.mix_weights: list[Tensor] = []      # a_i, (N, S)
        self.mix_grads: list[Tensor] = []        # dc_i, (N, M)
        self.token = _Collect.apply(self, weight, bias, values)

    def project(self, state: Tensor) -> Tensor:
        """`F.linear(state, weight, bias)`: (N, D) -> (N, P)."""
        return _Project.apply(state, self.token, self)

    def mix(self, weights: Tensor) -> Tensor:
        """sum_j a_nj V_bj for row n of sentence b = n // K: (N, S) -> (N, M)."""
        return _Mix.apply(weights, self.token, self)

    def _by_sentence(self, rows: Tensor) -> Tensor:
        """(N, X) -> (B, K, X)."""
        assert self.values is not None
        return rows.view(self.values.shape[0], -1, rows.shape[-1])


class _Collect(torch.autograd.Function):
    """Produces the token every step takes; its backward sums the recorded factors."""

    @staticmethod
    def forward(ctx, owner: SequenceGrads, weight: Tensor, bias: Tensor,
                values: Tensor | None) -> Tensor:
        ctx.owner = owner
        return weight.new_zeros(())

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, _grad_token: Tensor):
        owner = ctx.owner
        grad_weight = grad_bias = grad_values = None
        if owner.step_grads:
            grads = torch.cat(owner.step_grads)                             # (T*N, P)
            grad_weight = grads.t() @ torch.cat(owner.step_inputs)          # (P, D)
            grad_bias = grads.sum(0)
        if owner.mix_grads:
            weights = torch.cat([owner._by_sentence(w) for w in owner.mix_weights], 1)
            grads = torch.cat([owner._by_sentence(g) for g in owner.mix_grads], 1)
            grad_values = torch.bmm(weights.transpose(1, 2), grads)         # (B, S, M)
        owner.step_grads, owner.step_inputs = [], []
        owner.mix_weights, owner.mix_grads = [], []
        return None, grad_weight, grad_bias, grad_values


class _Project(torch.autograd.Function):
    @staticmethod
    def forward(ctx, state: Tensor, token: Tensor, owner: SequenceGrads) -> Tensor:
        ctx.owner = owner
        ctx.save_for_backward(state)
        return F.linear(state, owner.weight, owner.bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (state,) = ctx.saved_tensors
        owner = ctx.owner
        owner.step_grads.append(grad)
        owner.step_inputs.append(state)
        grad_state = grad @ owner.weight if ctx.needs_input_grad[0] else None
        return grad_state, grad.new_zeros(()), None


class _Mix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weights: Tensor, token: Tensor, owner: SequenceGrads) -> Tensor:
        ctx.owner = owner
        ctx.save_for_backward(weights)
        values = owner.values
        assert values is not None   # mix() is for a SequenceGrads built with values
        mixed = torch.bmm(owner._by_sentence(weights), values)            # (B, K, M)
        return mixed.view(weights.shape[0], -1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (weights,) = ctx.saved_tensors
        owner = ctx.owner
        owner.mix_weights.append(weights)
        owner.mix_grads.append(grad)
        grad_weights = None
        if ctx.needs_input_grad[0]:
            grad_weights = torch.bmm(owner._by_sentence(grad), owner.values.transpose(1, 2))
            grad_weights = grad_weights.view(weights.shape)
        return grad_weights, grad.new_zeros(()), None
