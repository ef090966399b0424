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

The parts: :mod:`.layers` (the layer rules: each layer type's norms and weighted sum),
:mod:`.units` (the unit layout: which unit each (draw, example) row belongs to),
:mod:`.support` (which trainable parameters it can clip exactly) and :mod:`.engine`
(:class:`BookKeepingEngine`: hooks, norms per unit, clipping, noise).
"""

from dpsynth_ml.dp.bookkeeping.engine import BookKeepingEngine, OptimizerHandle
from dpsynth_ml.dp.bookkeeping.layers import NormMode
from dpsynth_ml.dp.bookkeeping.support import UnsupportedModuleError, unsupported_parameters
from dpsynth_ml.dp.bookkeeping.units import _Rows as _Rows  # tests build unit layouts

__all__ = ["BookKeepingEngine", "NormMode", "OptimizerHandle", "UnsupportedModuleError",
           "unsupported_parameters"]
