"""The engine: :class:`BookKeepingEngine` keeps each trainable layer's records through
forward hooks, gets the output gradients with one ``torch.autograd.grad``, sums the layer
rules' (:mod:`.layers`) squared norms per unit of the layout (:mod:`.units`), clips, adds the
clipped sums of the logical step, and noises them once in :meth:`BookKeepingEngine.privatize`
(the design is in the package docstring, :mod:`dpsynth_ml.dp.bookkeeping`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from dpsynth_ml.dp.bookkeeping.layers import (
    _LAYER_CLASSES,
    NormMode,
    _Layer,
    _sq,
)
from dpsynth_ml.dp.bookkeeping.support import UnsupportedModuleError, unsupported_parameters
from dpsynth_ml.dp.bookkeeping.units import _Rows, group_rows
from dpsynth_ml.dp.noise import ChaChaGaussian, NoiseSource
from dpsynth_ml.dp.rows import clipped_one_hot_sums, clipped_row_sums

#: opacus' clip factor min(1, C / (||G|| + 1e-6)); kept so both engines release the same sum.
_CLIP_EPS = 1e-6


@dataclass
class _Record:
    """One forward pass of one layer: its input (detached) and output, with the version
    counters that show an in-place change, and later the gradient w.r.t. the output."""

    inp: torch.Tensor
    out: torch.Tensor | None
    inp_version: int
    out_version: int
    grad: torch.Tensor | None = None
    # a small layer's per-row gradients, kept from its norms for its weighted sum
    explicit: list[torch.Tensor] | None = None


@dataclass(frozen=True)
class OptimizerHandle:
    """What callers of the hooks engine read from its opacus optimizer: the plain torch
    optimizer that applies the private gradient, and the update's normaliser."""

    original_optimizer: Optimizer
    expected_batch_size: int


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
        return group_rows(groups, weights, draws)

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
        """Sum the layers' squared norms per unit, clip, add the clipped sum; the norms,
        factors and coefficients stay float64 on the rows' device (no copy per layer)."""
        num_units, device = rows.num_units, rows.unit.device
        sq = torch.zeros(num_units, dtype=torch.float64, device=device)
        for index in range(len(self.layers)):
            sq += self._layer_sq_norms(index, rows).to(device)
        scale = rows.scale.to(device)
        first: list[torch.Tensor] | None = None
        if carry_in:
            if self._carried is None:
                raise RuntimeError("carry_in without a carried subject")
            coef0 = (rows.unit == 0).to(torch.float64) * scale
            first = [c + g for c, g in zip(self._carried, self._weighted(coef0), strict=True)]
            sq[0] = _flat_sq(first).to(device)
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
        factors = self._clip_factors(norms)
        unit_factor = torch.zeros(num_units, dtype=torch.float64, device=device)
        unit_factor[:complete] = factors
        if first is not None and complete > 0:
            unit_factor[0] = 0.0  # unit 0 is added below from its explicit gradient
        coef = unit_factor[rows.unit] * scale
        clipped = self._weighted(coef)
        if first is not None and complete > 0:
            factor = float(factors[0])  # a Python number, as before: one copy, not per param
            clipped = [s + factor * f for s, f in zip(clipped, first, strict=True)]
        self._sums = clipped if self._sums is None else [
            s + c for s, c in zip(self._sums, clipped, strict=True)]
        self._carried = carried
        self._last_norms = norms
        return int((norms > self.max_grad_norm).sum().item())

    def _clip_factors(self, norms: torch.Tensor) -> torch.Tensor:
        """float64 [U]: each unit's clip factor min(1, C / (||G|| + 1e-6)), opacus' formula.
        (Tests inject a broken engine here, e.g. one that does not clip.)"""
        return (self.max_grad_norm / (norms + _CLIP_EPS)).clamp(max=1.0)

    def accumulate_gradients(self, rows: Sequence[torch.Tensor]) -> int:
        """Clip explicit per-unit gradient rows (one [n, *p.shape] tensor per trainable
        parameter, :attr:`params` order) with the factor every unit gets and add them to
        the step's sum (the white-box audit's canaries, issue 19). Returns how many of the
        n units had a norm above C; ValueError on rows that do not match."""
        self._no_carry()
        return self._add_clipped(*clipped_row_sums(rows, self._params, self._clip_factors))

    def accumulate_one_hot(self, positions: torch.Tensor, values: torch.Tensor) -> int:
        """:meth:`accumulate_gradients` for units that are each ONE trainable value (flat
        ``positions`` in :attr:`params` order, ``values`` there): O(n), so an audit can use
        10^5 canaries. ValueError on a position outside the trainable values."""
        self._no_carry()
        return self._add_clipped(*clipped_one_hot_sums(positions, values, self._params,
                                                       self._clip_factors))

    def _no_carry(self) -> None:
        if self._carried is not None:
            raise RuntimeError("a subject's contribution is carried: finish it first")

    def _add_clipped(self, clipped: list[torch.Tensor] | None, norms: torch.Tensor) -> int:
        if clipped is not None:
            self._sums = clipped if self._sums is None else [
                s + c for s, c in zip(self._sums, clipped, strict=True)]
        self._last_norms = norms
        return int((norms > self.max_grad_norm).sum().item())

    def per_sample_norms(self) -> torch.Tensor:
        """float64 flat L2 norms of the units completed by the last accumulate call (CPU)."""
        return self._last_norms.cpu()

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


def _flat_sq(tensors: list[torch.Tensor]) -> torch.Tensor:
    """float64 0-dim: the squared flat norm of ``tensors`` together, added one tensor at a
    time in order (as a Python float sum would), on the first tensor's device."""
    if not tensors:
        return torch.zeros((), dtype=torch.float64)
    total = _sq(tensors[0].reshape(1, -1))[0]
    for t in tensors[1:]:
        total = total + _sq(t.reshape(1, -1))[0].to(total.device)
    return total

