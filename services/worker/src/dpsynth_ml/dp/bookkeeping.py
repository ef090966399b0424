"""DP-SGD by book-keeping: exact per-unit clipping without per-example gradients or a
second backward (Bu, Wang, Zha and Karypis 2023, "Differentially private optimization on
large model at small cost", ICML; the ghost norm of Goodfellow 2015 and Li et al. 2022).

The released update is the one :class:`~dpsynth_ml.dp.engine.DpSgdEngine` releases,

    g = (sum_u c_u G_u + N(0, sigma^2 C^2 I)) / expected_batch_size,
    c_u = min(1, C / (||G_u|| + 1e-6)),

where u runs over the privacy units of the logical batch and ``||G_u||`` is the flat norm
of unit u's gradient over ALL trainable parameters (the 1e-6 is opacus' own, so both engines
clip identically). A unit is several "rows" r = (draw k, example i): the K diffusion draws of
one example (noise multiplicity) or all draws of all images of one subject (user-level DP);
G_u = sum_{r in u} w_r G_r with w_r = 1/K (the per-pass loss is divided by K) times the
subject weight of the example. Only the norm of the SUM is clipped, so the cross terms
<G_r, G_r'> between a unit's rows are part of ||G_u||^2; clipping each row separately would
give a unit sensitivity K * C (or n_j * K * C) and is not what is accounted.

How the pieces are computed, per trainable layer, from the input activation a (kept by a
forward hook) and the gradient g of the loss w.r.t. the layer's output (one
``torch.autograd.grad`` w.r.t. all kept outputs; it computes no parameter gradient at all):

* ``nn.Linear``, input [b, T, d_in] (T = 1 for [b, d_in]): G_r = g_r^T a_r, bias sum_t g_rt.
  Unit norms either explicitly (the per-row G_r, summed per unit, layer by layer, dropped
  after the layer) or by the ghost norm ||sum_r G_r||^2 = sum_{r, r' in u} sum_{t, s}
  (a_rt . a_r's)(g_rt . g_r's), which never forms G_r; the ghost norm is used when its
  pairs * T^2 products are fewer than rows * d_in * d_out. When the units are the examples
  (records, K draws each), an example's K rows are simply one sequence of K * T tokens, so
  its unit gradient is g_cat^T a_cat and no rows need pairing; subjects pair their rows.
* ``nn.Conv2d`` (groups = 1, zero padding): the input unfolded (``F.unfold``) to
  [b, L, C_in k_h k_w] and treated as Linear; the weighted sum uses
  ``torch.nn.grad.conv2d_weight`` (no unfold).
* ``nn.GroupNorm`` / ``nn.LayerNorm`` (affine): G_r(weight) = sum over positions of
  x_hat * g, G_r(bias) = sum g, x_hat recomputed from the kept input with the layer's eps.
* ``nn.Embedding``: G_r has a row per used id; ||G_u||^2 = sum over (unit, id) of the squared
  norm of the summed g rows with that id (the id-equality form sum_{id_t = id_s} g_t . g_s).

Then, with the clip factors known, the clipped sum of a layer is ONE weighted contraction
over the micro-batch, sum_r c_{u(r)} w_r G_r = (c w ⊙ g)^T a (book-keeping), added to a
running sum; the noise is added once per logical step in :meth:`BookKeepingEngine.privatize`.
Norms and clip factors are float64 (the ``fraction_clipped`` statistic compares an exact norm
with C); the contractions run in the parameters' dtype.

A subject split across micro-batches (``carry_out`` / ``carry_in``) is carried as its
explicit partial gradient (one row per parameter, as the hooks engine carries it); its norm
is completed explicitly in the micro-batch where it ends, and c_u times the carried part is
added to the sum there.

Memory: activations and output gradients of the trainable layers of all K passes of a
micro-batch (the K passes' cross terms need them), plus one layer's transient per-row
tensors; never the [b, ...] per-example gradients of all layers at once that opacus keeps.

Refused at construction (the caller then uses the hooks engine): a trainable parameter that
is not the ``weight``/``bias`` of a layer of exactly one of the supported types (subclasses
may compute something else in ``forward``), a parameter shared by two layers, Conv2d with
groups > 1 or non-zero padding mode, Embedding with ``max_norm``, ``scale_grad_by_freq`` or
``sparse``. Refused at run time: a layer called twice in one forward pass, an activation or
output modified in place after the layer ran, a batch dimension that is not the examples'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_weight as conv_weight_grad
from torch.optim import Optimizer

from dpsynth_ml.dp.noise import ChaChaGaussian, NoiseSource

NormMode = Literal["auto", "ghost", "explicit"]
#: opacus' clip factor min(1, C / (||G|| + 1e-6)); kept so both engines release the same sum.
_CLIP_EPS = 1e-6
#: elements of one chunk of ghost-norm pair products (bounds the transient T x T blocks).
_GHOST_CHUNK = 1 << 24
_SUPPORTED: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d, nn.GroupNorm, nn.LayerNorm,
                                           nn.Embedding)


class UnsupportedModuleError(ValueError):
    """The module has a trainable parameter the book-keeping engine cannot clip exactly."""


@dataclass
class _Record:
    """One forward pass of one layer: its input (detached) and output, with the version
    counters that show an in-place change, and later the gradient w.r.t. the output."""

    inp: torch.Tensor
    out: torch.Tensor | None
    inp_version: int
    out_version: int
    grad: torch.Tensor | None = None


@dataclass(frozen=True)
class OptimizerHandle:
    """What callers of the hooks engine read from its opacus optimizer: the plain torch
    optimizer that applies the private gradient, and the update's normaliser."""

    original_optimizer: Optimizer
    expected_batch_size: int


@dataclass(frozen=True)
class _Rows:
    """The rows of one micro-batch: unit[k, i] is the unit of example i's k-th draw,
    scale[i] its weight in the unit (the subject weight; 1/K is already in the gradient)."""

    unit: torch.Tensor  # [K, b] int64
    scale: torch.Tensor  # [b]
    num_units: int

    @property
    def example_units(self) -> bool:
        """Whether unit i is exactly example i's K rows (records with K draws)."""
        arange = torch.arange(self.unit.shape[1])
        return bool((self.unit == arange).all())

    @property
    def one_row_each(self) -> bool:
        """Whether row i of the single pass is unit i (K = 1, one example per unit)."""
        return self.unit.shape[0] == 1 and bool(
            torch.equal(self.unit[0], torch.arange(self.unit.shape[1])))


class _Layer:
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

    # --- per-row pieces, in the layer's own terms --------------------------------------

    def rows_explicit(self, index: int) -> list[torch.Tensor]:
        """Per-row gradients [b, *p.shape] of this layer's trainable params for pass
        ``index`` (explicit; used for the norms when not ghost)."""
        raise NotImplementedError

    def weighted(self, coef: torch.Tensor, index: int) -> list[torch.Tensor]:
        """sum_i coef_i G_{index, i} for each trainable param (the book-keeping sum)."""
        raise NotImplementedError

    def sq_norms(self, rows: _Rows) -> torch.Tensor:
        """float64 [U]: ||sum_{r in u} w_r G_r||^2 over this layer's trainable params."""
        total = torch.zeros(rows.num_units, dtype=torch.float64,
                            device=rows.unit.device)
        if len(self.records) == 1 and rows.one_row_each:  # rows are units: no folding
            per_row = self.rows_explicit(0)
            scale = rows.scale.to(per_row[0])
            for t in per_row:
                total += _sq(t * scale.view(-1, *([1] * (t.dim() - 1)))).to(total.device)
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


class _MatrixLayer(_Layer):
    """Linear and Conv2d: G_r = g_r^T a_r with a_r [T, d_in], g_r [T, d_out]."""

    def operands(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(a [b, T, d_in], g [b, T, d_out]) of pass ``index``."""
        raise NotImplementedError

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
        flat_unit = rows.unit.reshape(-1)
        # slot of each row within its unit: its rank among the unit's rows
        order = torch.argsort(flat_unit, stable=True)
        starts = torch.cumsum(per_unit, 0) - per_unit
        slot = torch.empty_like(flat_unit)
        slot[order] = torch.arange(len(flat_unit)) - starts[flat_unit[order]]
        longest = int(per_unit.max())
        unit, slot = flat_unit.to(a_rows.device), slot.to(a_rows.device)
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
        return self._sequence_sq_norms(a, g * rows.scale.to(g).view(-1, 1, 1), rows)

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


class _NormLayer(_Layer):
    """GroupNorm / LayerNorm: per-row affine gradients are small ([b, C]); always explicit."""

    def normalised(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        """(x_hat, the dims summed for a per-row parameter gradient)."""
        raise NotImplementedError

    def rows_explicit(self, index: int) -> list[torch.Tensor]:
        record = self.records[index]
        assert record.grad is not None
        g = record.grad
        x_hat, dims = self.normalised(record.inp)
        out: list[torch.Tensor] = []
        if self.train_weight:
            out.append((x_hat * g).sum(dim=dims) if dims else x_hat * g)
        if self.train_bias:
            out.append(g.sum(dim=dims) if dims else g)
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


def unsupported_parameters(module: nn.Module) -> list[str]:
    """Names of trainable parameters the book-keeping engine cannot clip exactly (empty
    when it can take the whole module); see the module docstring for the rules."""
    owners: dict[int, int] = {}
    problems: list[str] = []
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for p_name, p in mod.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            owners[id(p)] = owners.get(id(p), 0) + 1
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            reason = _layer_problem(mod, p_name)
            if reason:
                problems.append(f"{full} ({reason})")
    for name, p in module.named_parameters(remove_duplicate=False):
        if p.requires_grad and owners.get(id(p), 0) > 1:
            problems.append(f"{name} (shared by {owners[id(p)]} layers)")
    return sorted(set(problems))


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


class BookKeepingEngine:
    """Exact per-unit clipping by book-keeping, with :class:`DpSgdEngine`'s interface.

    Args:
        module: the model; forward passes go through ``self.module`` (the module itself,
            with forward hooks on its trainable layers).
        optimizer: a plain torch optimizer over exactly the trainable parameters.
        noise_multiplier: sigma > 0.
        max_grad_norm: C (flat clipping over all trainable parameters).
        expected_batch_size: public normaliser of the update.
        generator: TESTS ONLY, as for :class:`DpSgdEngine` (a seeded key for the ChaCha20
            noise; None in production: 256 fresh bits of OS entropy per engine).
        _test_noise: TESTS ONLY, as for :class:`DpSgdEngine` (the noise source itself).
        norm_mode: "auto" (ghost norm for a Linear/Conv2d layer when cheaper), or "ghost" /
            "explicit" for every such layer (tests check both paths).

    Raises:
        ValueError: if sigma is not > 0 or the optimizer does not hold exactly the trainable
            params; :class:`UnsupportedModuleError` if a trainable parameter cannot be
            clipped exactly here (use the hooks engine).
    """

    def __init__(self, module: nn.Module, optimizer: Optimizer, *, noise_multiplier: float,
                 max_grad_norm: float, expected_batch_size: int,
                 generator: torch.Generator | None = None,
                 _test_noise: NoiseSource | None = None, norm_mode: NormMode = "auto") -> None:
        if not noise_multiplier > 0:
            raise ValueError("noise_multiplier must be > 0 (tests inject a noise source)")
        problems = unsupported_parameters(module)
        if problems:
            raise UnsupportedModuleError(
                "the book-keeping engine cannot clip these exactly (use the hooks engine): "
                + ", ".join(problems[:8]) + (" ..." if len(problems) > 8 else ""))
        trainable = {id(p) for p in module.parameters() if p.requires_grad}
        # the optimizer's order, as the hooks engine's (so a replayed noise key matches)
        ordered: list[nn.Parameter] = [p for g in optimizer.param_groups for p in g["params"]]
        if trainable != {id(p) for p in ordered} or len(ordered) != len(trainable):
            raise ValueError("optimizer must hold exactly the module's trainable parameters")
        # the module itself, run as is (Any, like the hooks engine's GradSampleModule, so a
        # caller passes it where it expects its own model type)
        self.module: Any = module
        self.noise_multiplier = noise_multiplier
        self.max_grad_norm = max_grad_norm
        self.expected_batch_size = expected_batch_size
        self.optimizer = OptimizerHandle(optimizer, expected_batch_size)
        self.noise_source: NoiseSource = (
            _test_noise if _test_noise is not None
            else ChaChaGaussian.from_os_entropy() if generator is None
            else ChaChaGaussian.keyed_by(generator))
        self.layers: list[_Layer] = []
        for name, mod in module.named_modules():
            if type(mod) in _LAYER_CLASSES and any(
                    p.requires_grad for p in mod.parameters(recurse=False)):
                self.layers.append(_LAYER_CLASSES[type(mod)](name, mod, norm_mode))
        # the parameter order of ``params`` (the module's), and where each layer's go
        self._params = ordered
        position = {id(p): i for i, p in enumerate(ordered)}
        self._slots = [[position[id(p)] for p in layer.params] for layer in self.layers]
        self._handles = [layer.module.register_forward_hook(self._hook(layer))
                         for layer in self.layers]
        self._sums: list[torch.Tensor] | None = None
        self._carried: list[torch.Tensor] | None = None
        self._last_norms = torch.zeros(0, dtype=torch.float64)

    @property
    def params(self) -> Sequence[nn.Parameter]:
        """The parameters this engine clips, noises and updates."""
        return list(self._params)

    @property
    def original_optimizer(self) -> Optimizer:
        """The plain torch optimizer that applies the private gradient."""
        return self.optimizer.original_optimizer

    # --- recording ---------------------------------------------------------------------

    def _hook(self, layer: _Layer) -> Callable[[nn.Module, Any, Any], None]:
        def keep(module: nn.Module, inputs: Any, output: Any) -> None:
            if not torch.is_grad_enabled() or not isinstance(output, torch.Tensor) or (
                    not output.requires_grad):
                return
            if layer.pass_open:
                raise RuntimeError(f"{layer.name} ran twice in one forward pass; the "
                                   "book-keeping engine needs one call per layer (use hooks)")
            layer.pass_open = True
            x = inputs[0].detach()
            layer.records.append(_Record(x, output, x._version, output._version))
        return keep

    def _backward(self, loss: torch.Tensor, batch: int) -> None:
        """Gradients w.r.t. the outputs of this pass's records (no parameter gradient)."""
        open_layers = [layer for layer in self.layers if layer.pass_open]
        recs = [layer.records[-1] for layer in open_layers]
        for layer in self.layers:
            layer.pass_open = False
        for layer, rec in zip(open_layers, recs, strict=True):
            assert rec.out is not None
            if rec.inp._version != rec.inp_version or rec.out._version != rec.out_version:
                raise RuntimeError(f"{layer.name}: its input or output was modified in place "
                                   "after it ran; the book-keeping engine cannot use it")
            if rec.inp.shape[0] != batch:
                raise RuntimeError(f"{layer.name}: dim 0 of its input is not the batch")
        outs = [r.out for r in recs if r.out is not None]
        grads = torch.autograd.grad(loss, outs, allow_unused=True) if outs else ()
        for rec, out, g in zip(recs, outs, grads, strict=True):
            rec.grad = torch.zeros_like(out) if g is None else g.detach()
            rec.out = None  # the graph's output is not needed any more
        if len({len(layer.records) for layer in self.layers} - {0}) > 1:
            raise RuntimeError("a trainable layer was skipped in some forward passes")

    def _clear_records(self) -> None:
        for layer in self.layers:
            layer.records.clear()
            layer.pass_open = False

    # --- the engine interface -----------------------------------------------------------

    def accumulate(self, per_sample_loss: torch.Tensor) -> int:
        """One micro-batch (K = 1, one example per unit): clip each example, add to the sum.

        Args:
            per_sample_loss: loss per example [b], computed through ``self.module``.

        Returns:
            How many examples had a gradient norm above C (private).
        """
        b = len(per_sample_loss)
        try:
            self._backward(per_sample_loss.sum(), b)
        except BaseException:
            self._clear_records()
            raise
        groups = torch.arange(b)
        return self._finish(self._rows(groups, torch.ones(b, dtype=torch.float64), 1),
                            carry_in=False, carry_out=False)

    def accumulate_draws(self, draw_losses: Callable[[], torch.Tensor],
                         draws: int) -> tuple[int, torch.Tensor]:
        """Noise multiplicity: clip each example's gradient averaged over ``draws`` draws
        (one unit = the K rows of one example; cross terms included). As
        :meth:`DpSgdEngine.accumulate_draws`.

        Returns:
            (how many examples had a mean-gradient norm above C, the K-draw mean loss [b]).
        """
        mean_loss = self._draw_passes(draw_losses, draws)
        b = len(mean_loss)
        rows = self._rows(torch.arange(b), torch.ones(b, dtype=torch.float64), draws)
        return self._finish(rows, carry_in=False, carry_out=False), mean_loss

    def accumulate_subject_draws(self, draw_losses: Callable[[], torch.Tensor], draws: int,
                                 groups: torch.Tensor, weights: torch.Tensor, *,
                                 carry_in: bool = False,
                                 carry_out: bool = False) -> tuple[int, torch.Tensor]:
        """User-level DP-SGD: one clipped contribution ``sum_{i in j} weights[i] g_i`` per
        subject j (g_i the K-draw mean gradient), a subject possibly spanning micro-batches.
        As :meth:`DpSgdEngine.accumulate_subject_draws` (same arguments and returns)."""
        if groups.numel() == 0:
            raise ValueError("a micro-batch needs at least one example")
        mean_loss = self._draw_passes(draw_losses, draws)
        rows = self._rows(groups, weights, draws)
        return self._finish(rows, carry_in=carry_in, carry_out=carry_out), mean_loss

    def _rows(self, groups: torch.Tensor, weights: torch.Tensor, draws: int) -> _Rows:
        """The unit of every (draw, example) row: the example's group for all K draws.
        (Tests inject wrong engines here, e.g. a unit per row.)"""
        groups = groups.to(torch.long)
        return _Rows(unit=groups.unsqueeze(0).expand(draws, -1).contiguous(),
                     scale=weights.to(torch.float64),
                     num_units=int(groups.max()) + 1 if groups.numel() else 0)

    def _draw_passes(self, draw_losses: Callable[[], torch.Tensor], draws: int) -> torch.Tensor:
        """K forward passes, each followed by its output-gradient pass (loss / K), all
        records kept; returns the K-draw mean loss per example."""
        if draws < 1:
            raise ValueError("draws must be >= 1")
        mean_loss: torch.Tensor | None = None
        try:
            for _ in range(draws):
                losses = draw_losses()
                self._backward(losses.sum() / draws, len(losses))
                detached = losses.detach() / draws
                mean_loss = detached if mean_loss is None else mean_loss + detached
        except BaseException:
            self._clear_records()
            raise
        assert mean_loss is not None
        return mean_loss

    def _layer_sq_norms(self, index: int, rows: _Rows) -> torch.Tensor:
        """float64 [U]: layer ``index``'s part of each unit's squared gradient norm.
        (Tests inject a wrong engine here, e.g. one that skips a layer.)"""
        return self.layers[index].sq_norms(rows)

    def _weighted(self, coef: torch.Tensor) -> list[torch.Tensor]:
        """sum over passes and rows of coef[k, i] G_{k, i}, per trainable param (in
        ``params`` order); zeros for a layer that did not run."""
        out = [torch.zeros_like(p) for p in self._params]
        for layer, slots in zip(self.layers, self._slots, strict=True):
            for k in range(len(layer.records)):
                for slot, t in zip(slots, layer.weighted(coef[k], k), strict=True):
                    out[slot] += t.to(out[slot].dtype)
        return out

    def _finish(self, rows: _Rows, *, carry_in: bool, carry_out: bool) -> int:
        """Norms of the units, the clipped weighted sum, the carried partial unit."""
        try:
            return self._clip_units(rows, carry_in=carry_in, carry_out=carry_out)
        finally:
            self._clear_records()

    def _clip_units(self, rows: _Rows, *, carry_in: bool, carry_out: bool) -> int:
        num_units = rows.num_units
        sq = torch.zeros(num_units, dtype=torch.float64)
        for index in range(len(self.layers)):
            sq += self._layer_sq_norms(index, rows).cpu()
        scale = rows.scale.to(rows.unit.device)
        first: list[torch.Tensor] | None = None
        if carry_in:
            if self._carried is None:
                raise RuntimeError("carry_in without a carried subject")
            coef0 = (rows.unit == 0).to(torch.float64) * scale
            first = [c + g for c, g in zip(self._carried, self._weighted(coef0), strict=True)]
            sq[0] = sum(float(_sq(t.reshape(1, -1))[0]) for t in first)
        carried: list[torch.Tensor] | None = None
        complete = num_units
        if carry_out:
            complete = num_units - 1
            if first is not None and num_units == 1:
                carried = first
            else:
                last = (rows.unit == num_units - 1).to(torch.float64) * scale
                carried = self._weighted(last)
        norms = sq[:complete].clamp(min=0).sqrt()
        factors = (self.max_grad_norm / (norms + _CLIP_EPS)).clamp(max=1.0)
        unit_factor = torch.zeros(num_units, dtype=torch.float64)
        unit_factor[:complete] = factors
        if first is not None and complete > 0:
            unit_factor[0] = 0.0  # unit 0 is added below from its explicit gradient
        coef = unit_factor.to(rows.unit.device)[rows.unit] * scale
        clipped = self._weighted(coef)
        if first is not None and complete > 0:
            clipped = [s + float(factors[0]) * f for s, f in zip(clipped, first, strict=True)]
        self._sums = clipped if self._sums is None else [
            s + c for s, c in zip(self._sums, clipped, strict=True)]
        self._carried = carried
        self._last_norms = norms
        return int((norms > self.max_grad_norm).sum().item())

    def per_sample_norms(self) -> torch.Tensor:
        """float64 flat L2 norms of the units completed by the last accumulate call."""
        return self._last_norms

    def _noised(self, sums: list[torch.Tensor]) -> list[torch.Tensor]:
        """The clipped sum plus N(0, sigma^2 C^2 I): one draw per (device, dtype), split
        over the parameters in order (as the hooks engine draws it)."""
        std = self.noise_multiplier * self.max_grad_norm
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, s in enumerate(sums):
            groups.setdefault((s.device, s.dtype), []).append(i)
        out = list(sums)
        for (device, dtype), members in groups.items():
            sizes = [sums[i].numel() for i in members]
            flat = self.noise_source.gaussian((sum(sizes),), std, device=device, dtype=dtype)
            for i, noise in zip(members, torch.split(flat, sizes), strict=True):
                out[i] = sums[i] + noise.view_as(sums[i])
        return out

    def privatize(self) -> None:
        """Finish a logical step: noise once, divide by B_expected, leave it in ``p.grad``.
        An empty logical batch gives pure noise (a step the accountant counts)."""
        if self._carried is not None:
            raise RuntimeError("a subject's contribution was carried but never completed")
        sums = self._sums if self._sums is not None else [
            torch.zeros_like(p) for p in self._params]
        for p, g in zip(self._params, self._release(sums), strict=True):
            p.grad = g / self.expected_batch_size
        self._sums = None

    def _release(self, sums: list[torch.Tensor]) -> list[torch.Tensor]:
        """The released (noised) sum of one logical step (overridden for ranks)."""
        return self._noised(sums)

    def apply_update(self) -> None:
        """Apply the underlying optimizer to the private gradient and clear all grads."""
        self.original_optimizer.step()
        self.original_optimizer.zero_grad(set_to_none=True)

    def discard(self) -> None:
        """Drop the accumulated (unreleased) state without updating (tests, aborts)."""
        self._sums = None
        self._carried = None
        self._clear_records()
        self.original_optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Remove the forward hooks."""
        self.discard()
        for handle in self._handles:
            handle.remove()
        self._handles = []
