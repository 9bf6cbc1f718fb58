"""BiRNNEncoder: embeddings -> bidirectional GRU -> annotations h_j = [fwd h_j ; bwd h_j].

Bahdanau et al. (2015), section 3.2 and appendix A.2.1. Padding is handled exactly: the forward
GRU stops at each sentence's last real token and the backward GRU starts there, so a sentence's
annotations do not depend on how much padding its batch adds. Annotations at padding are 0.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from bahdanau import functional
from bahdanau._checks import check_lengths, check_tensor, check_token_ids
from bahdanau.config import GRU_FORMS


def init_recurrent_(weight: Tensor, hidden_size: int) -> None:
    """Orthogonal initialisation of each (hidden, hidden) gate block of a (3*hidden, hidden) U."""
    with torch.no_grad():
        for block in weight.split(hidden_size, dim=0):
            nn.init.orthogonal_(block)


class BiRNNEncoder(nn.Module):
    """Bidirectional GRU encoder.

    Args:
        vocab_size: source V.
        embed_size: E.
        hidden_size: H per direction; annotations have 2H features.
        pad_id: padding id (its embedding is kept at 0).
        dropout: dropout on the embeddings (0 in the paper).
        gru_form: "torch" uses `torch.nn.GRU` (reset gate applied after U: r * (U h + b)), the
            fast path; "paper" runs the paper's GRU (U (r * h)) in a Python loop over positions,
            both directions at once. See `bahdanau.functional.gru_update`.
    """

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, *, pad_id: int = 0,
                 dropout: float = 0.0, gru_form: str = "torch") -> None:
        super().__init__()
        if gru_form not in GRU_FORMS:
            raise ValueError(f"gru_form must be one of {GRU_FORMS}, got {gru_form!r}")
        self.vocab_size, self.embed_size, self.hidden_size = vocab_size, embed_size, hidden_size
        self.pad_id, self.gru_form = pad_id, gru_form
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=pad_id)
        self.dropout = nn.Dropout(dropout)
        # Parameters named as torch.nn.GRU names them, so both forms load the same state dict.
        self.rnn = nn.GRU(embed_size, hidden_size, batch_first=True, bidirectional=True)
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

    def forward(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Encode a padded batch.

        Args:
            src: (B, S) source token ids, padded after each sentence's end.
            src_lengths: (B,) number of real tokens per sentence, each in [1, S].
        Returns:
            (B, S, 2H) annotations h_j (0 at padding) and the (B, S) bool mask, True at real tokens.
        Raises:
            ValueError: wrong ranks or dtypes, empty sentences, lengths beyond S, ids outside V.
        """
        check_tensor("src", src, 2, integer=True)
        batch, src_len = src.shape
        check_lengths("src_lengths", src_lengths, batch, src_len)
        mask = functional.lengths_to_mask(src_lengths.to(src.device), src_len)
        check_token_ids("src", src, self.vocab_size)              # padding is embedded too
        embedded = self.dropout(self.embedding(src))              # (B, S, E)
        if self.gru_form == "paper":
            return self._paper_gru(embedded, mask), mask
        lengths = src_lengths.cpu()
        if bool((lengths == src_len).all()):
            annotations, _ = self.rnn(embedded)                   # (B, S, 2H) no padding at all
        else:
            packed = pack_padded_sequence(embedded, lengths, batch_first=True,
                                          enforce_sorted=False)
            out, _ = self.rnn(packed)
            annotations, _ = pad_packed_sequence(out, batch_first=True, total_length=src_len)
        return annotations, mask

    def _paper_gru(self, embedded: Tensor, mask: Tensor) -> Tensor:
        """Both directions of the paper's GRU in one loop (fwd at position t, bwd at S-1-t)."""
        rnn, hidden = self.rnn, self.hidden_size
        batch, src_len, _ = embedded.shape
        x_fwd = nn.functional.linear(embedded, rnn.weight_ih_l0, rnn.bias_ih_l0)  # (B, S, 3H)
        x_bwd = nn.functional.linear(embedded, rnn.weight_ih_l0_reverse, rnn.bias_ih_l0_reverse)
        w_rz = torch.stack([rnn.weight_hh_l0[: 2 * hidden], rnn.weight_hh_l0_reverse[: 2 * hidden]])
        b_rz = torch.stack([rnn.bias_hh_l0[: 2 * hidden], rnn.bias_hh_l0_reverse[: 2 * hidden]])
        w_n = (rnn.weight_hh_l0[2 * hidden:], rnn.weight_hh_l0_reverse[2 * hidden:])
        b_n = (rnn.bias_hh_l0[2 * hidden:], rnn.bias_hh_l0_reverse[2 * hidden:])
        h = embedded.new_zeros(2, batch, hidden)                  # (2, B, H) fwd, bwd
        outputs: list[list[Tensor]] = [[], []]
        for t in range(src_len):
            h_gates = torch.baddbmm(b_rz[:, None], h, w_rz.transpose(1, 2))  # (2, B, 2H)
            new = []
            for d, x in ((0, x_fwd[:, t]), (1, x_bwd[:, src_len - 1 - t])):
                real = mask[:, t if d == 0 else src_len - 1 - t, None]
                h_d = functional.gru_update(x, h_gates[d], h[d], weight_hn=w_n[d], bias_hn=b_n[d])
                h_d = torch.where(real, h_d, h[d])                # padding keeps the state
                outputs[d].append(torch.where(real, h_d, torch.zeros_like(h_d)))
                new.append(h_d)
            h = torch.stack(new)
        fwd = torch.stack(outputs[0], dim=1)                       # (B, S, H)
        bwd = torch.stack(outputs[1][::-1], dim=1)                 # (B, S, H)
        return torch.cat([fwd, bwd], dim=-1)
