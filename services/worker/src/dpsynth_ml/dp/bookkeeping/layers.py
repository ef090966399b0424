"""The layer rules: each supported layer type's per-unit squared gradient norms and its
weighted (book-keeping) sum, from the records the engine keeps (input activation and
gradient w.r.t. the output); the formulas are in the package docstring
(:mod:`dpsynth_ml.dp.bookkeeping`). ``_LAYER_CLASSES`` maps a layer type to its rule and
:func:`_layer_problem` says why a parameter is outside every rule.

A rule derives from :class:`_Layer` (abstract ``sq_norms`` + ``weighted``); the rules whose
norms fold explicit per-row gradients into units derive from :class:`_ExplicitLayer`, which
provides ``sq_norms`` and requires ``rows_explicit``. Embedding computes its norms directly
(id equality) and has no explicit per-row form.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_weight as conv_weight_grad

from dpsynth_ml.dp.bookkeeping.units import _Rows

if TYPE_CHECKING:  # the engine makes the records; a layer only reads them
    from dpsynth_ml.dp.bookkeeping.engine import _Record

NormMode = Literal["auto", "ghost", "explicit"]
#: elements of one chunk of ghost-norm pair products (bounds the transient T x T blocks).
_GHOST_CHUNK = 1 << 24


class _Layer(abc.ABC):
    """One trainable layer: which of its parameters train, its records of this micro-batch."""

    def __init__(self, name: str, module: nn.Module, mode: NormMode) -> None:
        self.name = name
        self.module = module
        self.mode = mode
        self.train_weight = _trains(module, "weight")
        self.train_bias = _trains(module, "bias")
        # the order every per-layer list of tensors follows: weight, then bias
        self.params: list[nn.Parameter] = [
            getattr(module, n) for n, trains in (("weight", self.train_weight),
                                                 ("bias", self.train_bias)) if trains]
        self.records: list[_Record] = []
        self.pass_open = False

    @abc.abstractmethod
    def sq_norms(self, rows: _Rows) -> torch.Tensor:
        """float64 [U]: ||sum_{r in u} w_r G_r||^2 over this layer's trainable params."""

    @abc.abstractmethod
    def weighted(self, coef: torch.Tensor, index: int) -> list[torch.Tensor]:
        """sum_i coef_i G_{index, i} for each trainable param (the book-keeping sum)."""


class _ExplicitLayer(_Layer):
    """A rule with an explicit per-row gradient; its norms fold the rows into units."""

    @abc.abstractmethod
    def rows_explicit(self, index: int) -> list[torch.Tensor]:
        """Per-row gradients [b, *p.shape] of this layer's trainable params for pass
        ``index`` (explicit; used for the norms when not ghost)."""

    def sq_norms(self, rows: _Rows) -> torch.Tensor:
        """The per-row gradients, weighted and summed per unit (no fold when each unit is
        one row), then squared: float64 [U]."""
        total = torch.zeros(rows.num_units, dtype=torch.float64,
                            device=rows.unit.device)
        if len(self.records) == 1 and rows.one_row_each:  # rows are units: no folding
            per_row = self.rows_explicit(0)
            scale = rows.scale.to(per_row[0])
            for t in per_row:
                weighted = t if rows.unit_weights else t * scale.view(-1, *([1] * (t.dim() - 1)))
                total += _sq(weighted).to(total.device)
            return total
        per_unit: list[torch.Tensor] | None = None
        for k in range(len(self.records)):
            per_row = self.rows_explicit(k)
            scale, unit = rows.scale.to(per_row[0]), rows.unit[k].to(per_row[0].device)
            if per_unit is None:
                per_unit = [torch.zeros((rows.num_units, *t.shape[1:]), dtype=t.dtype,
                                        device=t.device) for t in per_row]
            for acc, t in zip(per_unit, per_row, strict=True):
                acc.index_add_(0, unit, t * scale.view(-1, *([1] * (t.dim() - 1))))
        for acc in per_unit or []:
            total += _sq(acc).to(total.device)
        return total


def _trains(module: nn.Module, name: str) -> bool:
    p = getattr(module, name, None)
    return isinstance(p, nn.Parameter) and p.requires_grad


def _sq(t: torch.Tensor) -> torch.Tensor:
    """float64 squared L2 norm of each row of ``t`` [n, ...] (the input cast first)."""
    norms: torch.Tensor = torch.linalg.vector_norm(t.reshape(len(t), -1), dim=1,
                                                   dtype=torch.float64)
    return norms.square()



class _MatrixLayer(_ExplicitLayer):
    """Linear and Conv2d: G_r = g_r^T a_r with a_r [T, d_in], g_r [T, d_out]."""

    @abc.abstractmethod
    def operands(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(a [b, T, d_in], g [b, T, d_out]) of pass ``index``."""

    def sizes(self) -> tuple[int, int, int]:
        """(T, d_in, d_out) of this layer's last forward (without unfolding anything)."""
        rec = self.records[0]
        assert rec.grad is not None
        weight = self.module.weight
        assert isinstance(weight, torch.Tensor)
        d_out = int(weight.shape[0])
        d_in = weight.numel() // d_out
        return rec.grad.numel() // (rec.grad.shape[0] * d_out), d_in, d_out

    def to_weight(self, flat: torch.Tensor) -> torch.Tensor:
        """A [..., d_out, d_in] weight gradient in the weight's shape."""
        weight = self.module.weight
        assert isinstance(weight, torch.Tensor)
        return flat.reshape(*flat.shape[:-2], *weight.shape)

    def rows_explicit(self, index: int) -> list[torch.Tensor]:
        a, g = self.operands(index)
        out: list[torch.Tensor] = []
        if self.train_weight:
            out.append(self.to_weight(torch.bmm(g.transpose(1, 2), a)))
        if self.train_bias:
            out.append(g.sum(dim=1))
        return out

    def sq_norms(self, rows: _Rows) -> torch.Tensor:
        if not self.records:
            return torch.zeros(rows.num_units, dtype=torch.float64, device=rows.unit.device)
        if rows.example_units:
            return self._example_sq_norms(rows)
        flat_unit = rows.unit.reshape(-1)
        per_unit = torch.bincount(flat_unit, minlength=rows.num_units)
        if rows.num_units * int(per_unit.max()) <= 2 * len(flat_unit):
            return self._padded_sq_norms(rows, per_unit)
        tokens, d_in, d_out = self.sizes()
        same = flat_unit[:, None] == flat_unit[None, :]
        pairs = int(same.sum())
        ghost = self.mode == "ghost" or (
            self.mode == "auto" and pairs * tokens * tokens < flat_unit.numel() * d_in * d_out)
        if not ghost or not self.train_weight:
            return super().sq_norms(rows)
        total = torch.zeros(rows.num_units, dtype=torch.float64, device=rows.unit.device)
        pieces = [self.operands(k) for k in range(len(self.records))]
        a = torch.cat([p[0] for p in pieces]) if len(pieces) > 1 else pieces[0][0]
        scale = rows.scale.to(a).view(-1, 1, 1)
        g = torch.cat([p[1] * scale for p in pieces])
        del pieces
        unit = flat_unit.to(a.device)
        if self.train_bias:  # bias: explicit per unit (d_out numbers per unit)
            acc = torch.zeros((rows.num_units, d_out), dtype=g.dtype, device=g.device)
            acc.index_add_(0, unit, g.sum(dim=1))
            total += _sq(acc).to(total.device)
        chunk = max(1, _GHOST_CHUNK // max(1, tokens * tokens))
        if pairs == len(flat_unit):  # one row per unit: the diagonal only, no gathering
            for start in range(0, len(a), chunk):
                aa = torch.bmm(a[start:start + chunk], a[start:start + chunk].transpose(1, 2))
                gg = torch.bmm(g[start:start + chunk], g[start:start + chunk].transpose(1, 2))
                part = (aa * gg).sum(dim=(1, 2), dtype=torch.float64)
                total.index_add_(0, unit[start:start + chunk].to(total.device),
                                 part.to(total.device))
            return total
        left, right = (t.to(a.device) for t in same.nonzero(as_tuple=True))
        for start in range(0, len(left), chunk):
            li, ri = left[start:start + chunk], right[start:start + chunk]
            aa = torch.bmm(a[li], a[ri].transpose(1, 2))
            gg = torch.bmm(g[li], g[ri].transpose(1, 2))
            part = (aa * gg).sum(dim=(1, 2), dtype=torch.float64)
            total.index_add_(0, unit[li].to(total.device), part.to(total.device))
        return total

    def _padded_sq_norms(self, rows: _Rows, per_unit: torch.Tensor) -> torch.Tensor:
        """Units of several rows (subjects): each unit's rows laid end to end as one
        sequence, zero-padded to the longest unit's (zeros add nothing to g^T a), then as
        :meth:`_example_sq_norms`. Used when padding at most doubles the rows."""
        pieces = [self.operands(k) for k in range(len(self.records))]
        a_rows = torch.cat([p[0] for p in pieces]) if len(pieces) > 1 else pieces[0][0]
        g_rows = torch.cat([p[1] for p in pieces]) if len(pieces) > 1 else pieces[0][1]
        del pieces
        g_rows = g_rows * rows.scale.to(g_rows).repeat(len(self.records)).view(-1, 1, 1)
        longest = int(per_unit.max())
        unit = rows.unit.reshape(-1).to(a_rows.device)
        slot = rows.slots(per_unit).to(a_rows.device)
        a = a_rows.new_zeros((rows.num_units, longest, *a_rows.shape[1:]))
        g = g_rows.new_zeros((rows.num_units, longest, *g_rows.shape[1:]))
        a[unit, slot] = a_rows
        g[unit, slot] = g_rows
        del a_rows, g_rows
        return self._sequence_sq_norms(a.flatten(1, 2), g.flatten(1, 2), rows)

    def _example_sq_norms(self, rows: _Rows) -> torch.Tensor:
        """Units = examples: an example's K rows are one sequence of K * T tokens (its unit
        gradient is g_cat^T a_cat), so the cross terms come without pairing rows."""
        pieces = [self.operands(k) for k in range(len(self.records))]
        a = torch.cat([p[0] for p in pieces], dim=1) if len(pieces) > 1 else pieces[0][0]
        g = torch.cat([p[1] for p in pieces], dim=1) if len(pieces) > 1 else pieces[0][1]
        del pieces
        if not rows.unit_weights:
            g = g * rows.scale.to(g).view(-1, 1, 1)
        return self._sequence_sq_norms(a, g, rows)

    def _sequence_sq_norms(self, a: torch.Tensor, g: torch.Tensor,
                           rows: _Rows) -> torch.Tensor:
        """||g_u^T a_u||^2 (+ the bias part) for unit sequences a [U, L, d_in], g [U, L,
        d_out] (already weighted): explicit or ghost, whichever is cheaper."""
        tokens, d_in, d_out = a.shape[1], a.shape[2], g.shape[2]
        total = torch.zeros(rows.num_units, dtype=torch.float64, device=rows.unit.device)
        if self.train_bias:
            total += _sq(g.sum(dim=1)).to(total.device)
        if not self.train_weight:
            return total
        ghost = self.mode == "ghost" or (self.mode == "auto" and tokens * tokens < d_in * d_out)
        if not ghost:
            return total + _sq(torch.bmm(g.transpose(1, 2), a)).to(total.device)
        chunk = max(1, _GHOST_CHUNK // max(1, tokens * tokens))
        parts = []
        for start in range(0, len(a), chunk):
            aa = torch.bmm(a[start:start + chunk], a[start:start + chunk].transpose(1, 2))
            gg = torch.bmm(g[start:start + chunk], g[start:start + chunk].transpose(1, 2))
            parts.append((aa * gg).sum(dim=(1, 2), dtype=torch.float64))
        return total + torch.cat(parts).to(total.device)

    def weighted(self, coef: torch.Tensor, index: int) -> list[torch.Tensor]:
        a, g = self.operands(index)
        cg = g * coef.to(g).view(-1, 1, 1)
        out: list[torch.Tensor] = []
        if self.train_weight:
            out.append(self.to_weight(cg.flatten(0, 1).T @ a.flatten(0, 1)))
        if self.train_bias:
            out.append(cg.sum(dim=(0, 1)))
        return out


class _LinearLayer(_MatrixLayer):
    def operands(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rec = self.records[index]
        assert rec.grad is not None
        b = rec.inp.shape[0]
        return (rec.inp.reshape(b, -1, rec.inp.shape[-1]),
                rec.grad.reshape(b, -1, rec.grad.shape[-1]))

    def to_weight(self, flat: torch.Tensor) -> torch.Tensor:
        return flat


class _Conv2dLayer(_MatrixLayer):
    def operands(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rec = self.records[index]
        assert rec.grad is not None
        conv = self.module
        assert isinstance(conv, nn.Conv2d)
        padding = conv.padding
        assert not isinstance(padding, str)
        a = F.unfold(rec.inp, conv.kernel_size, dilation=conv.dilation, padding=padding,
                     stride=conv.stride)
        b = rec.grad.shape[0]
        return a.transpose(1, 2), rec.grad.reshape(b, rec.grad.shape[1], -1).transpose(1, 2)

    def weighted(self, coef: torch.Tensor, index: int) -> list[torch.Tensor]:
        rec = self.records[index]
        assert rec.grad is not None
        conv = self.module
        assert isinstance(conv, nn.Conv2d)
        cg = rec.grad * coef.to(rec.grad).view(-1, 1, 1, 1)
        out: list[torch.Tensor] = []
        if self.train_weight:
            out.append(conv_weight_grad(  # type: ignore[no-untyped-call]  # torch
                rec.inp, conv.weight.shape, cg, stride=conv.stride, padding=conv.padding,
                dilation=conv.dilation, groups=conv.groups))
        if self.train_bias:
            out.append(cg.sum(dim=(0, 2, 3)))
        return out


class _NormLayer(_ExplicitLayer):
    """GroupNorm / LayerNorm: per-row affine gradients are small ([b, C]); always explicit."""

    @abc.abstractmethod
    def normalised(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        """(x_hat, the dims summed for a per-row parameter gradient)."""

    def rows_explicit(self, index: int) -> list[torch.Tensor]:
        """The per-row gradients, computed once per record (the norms and the weighted sum
        both read them; [b, C] each, so keeping them costs nothing next to the input)."""
        record = self.records[index]
        if record.explicit is not None:
            return record.explicit
        assert record.grad is not None
        g = record.grad
        x_hat, dims = self.normalised(record.inp)
        out: list[torch.Tensor] = []
        if self.train_weight:
            out.append((x_hat * g).sum(dim=dims) if dims else x_hat * g)
        if self.train_bias:
            out.append(g.sum(dim=dims) if dims else g)
        record.explicit = out
        return out

    def weighted(self, coef: torch.Tensor, index: int) -> list[torch.Tensor]:
        per_row = self.rows_explicit(index)
        return [torch.tensordot(coef.to(t), t, dims=([0], [0])) for t in per_row]


class _GroupNormLayer(_NormLayer):
    def normalised(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        gn = self.module
        assert isinstance(gn, nn.GroupNorm)
        grouped = x.reshape(x.shape[0], gn.num_groups, -1)
        var, mean = torch.var_mean(grouped, dim=2, unbiased=False, keepdim=True)
        x_hat = ((grouped - mean) * torch.rsqrt(var + gn.eps)).reshape(x.shape)
        return x_hat, tuple(range(2, x.dim()))


class _LayerNormLayer(_NormLayer):
    def normalised(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        ln = self.module
        assert isinstance(ln, nn.LayerNorm)
        n = len(ln.normalized_shape)
        if x.dim() <= n:
            raise RuntimeError(f"{self.name}: LayerNorm input has no batch dimension")
        dims = tuple(range(x.dim() - n, x.dim()))
        var, mean = torch.var_mean(x, dim=dims, unbiased=False, keepdim=True)
        return (x - mean) * torch.rsqrt(var + ln.eps), tuple(range(1, x.dim() - n))


class _EmbeddingLayer(_Layer):
    """G_r = sum_t onehot(id_rt) g_rt^T: norms by summing g per (unit, id)."""

    def ids_and_grads(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [b, T], g [b, T, D]) with padding_idx entries' g zeroed (no gradient)."""
        rec = self.records[index]
        assert rec.grad is not None
        emb = self.module
        assert isinstance(emb, nn.Embedding)
        b = rec.inp.shape[0]
        ids = rec.inp.reshape(b, -1)
        g = rec.grad.reshape(b, ids.shape[1], -1)
        if emb.padding_idx is not None:
            g = g * (ids != emb.padding_idx).unsqueeze(-1).to(g)
        return ids, g

    def sq_norms(self, rows: _Rows) -> torch.Tensor:
        total = torch.zeros(rows.num_units, dtype=torch.float64, device=rows.unit.device)
        if not self.records or not self.train_weight:
            return total
        emb = self.module
        assert isinstance(emb, nn.Embedding)
        keys, values = [], []
        for k in range(len(self.records)):
            ids, g = self.ids_and_grads(k)
            unit = rows.unit[k].to(ids.device)
            keys.append((unit[:, None] * emb.num_embeddings + ids).reshape(-1))
            values.append((g * rows.scale.to(g).view(-1, 1, 1)).reshape(-1, g.shape[-1]))
        key, value = torch.cat(keys), torch.cat(values)
        unique, inverse = torch.unique(key, return_inverse=True)
        summed = torch.zeros((len(unique), value.shape[-1]), dtype=value.dtype,
                             device=value.device)
        summed.index_add_(0, inverse, value)
        owner = (unique // emb.num_embeddings).to(total.device)
        total.index_add_(0, owner, _sq(summed).to(total.device))
        return total

    def weighted(self, coef: torch.Tensor, index: int) -> list[torch.Tensor]:
        ids, g = self.ids_and_grads(index)
        emb = self.module
        assert isinstance(emb, nn.Embedding)
        out = torch.zeros_like(emb.weight)
        cg = (g * coef.to(g).view(-1, 1, 1)).reshape(-1, g.shape[-1])
        out.index_add_(0, ids.reshape(-1), cg.to(out.dtype))
        return [out] if self.train_weight else []


_LAYER_CLASSES: dict[type[nn.Module], type[_Layer]] = {
    nn.Linear: _LinearLayer, nn.Conv2d: _Conv2dLayer, nn.GroupNorm: _GroupNormLayer,
    nn.LayerNorm: _LayerNormLayer, nn.Embedding: _EmbeddingLayer}


def _layer_problem(mod: nn.Module, p_name: str) -> str:
    """Why the trainable parameter ``p_name`` of ``mod`` is not supported ('' if it is)."""
    if type(mod) not in _LAYER_CLASSES:
        return f"{type(mod).__name__} is not a supported layer type"
    if p_name not in ("weight", "bias"):
        return "not a weight or bias"
    if isinstance(mod, nn.Conv2d) and (mod.groups != 1 or mod.padding_mode != "zeros"
                                       or isinstance(mod.padding, str)):
        return "Conv2d with groups > 1, non-zero or string padding"
    if isinstance(mod, nn.Embedding) and (mod.max_norm is not None or mod.scale_grad_by_freq
                                          or mod.sparse):
        return "Embedding with max_norm, scale_grad_by_freq or sparse"
    return ""
