"""DP-SGD around a torch optimizer: per-example clipping, one noise draw per logical step.

This is the only place (with ``dp/__init__``) that imports opacus. The update is Abadi et
al. (2016), Algorithm 1, with Poisson sampling and the add/remove normalisation used by
DP-LDMs and DPDM:

    g = (sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / expected_batch_size

Per-example gradients come from opacus ``GradSampleModule`` in hooks mode (Linear, Conv2d,
GroupNorm, LayerNorm, Embedding all have grad samplers; diffusers attention is Linear-based,
so ``F.scaled_dot_product_attention`` itself needs none). Clipping and noise are opacus'
``DPOptimizer``; a logical batch is fed in physical micro-batches, each clipped and summed
into ``p.summed_grad`` (``signal_skip_step``), then :meth:`DpSgdEngine.privatize` adds the
noise once and divides by the *expected* batch size, never by the realised one. The noise is
NOT opacus' ``torch.normal``: :class:`SourcedNoiseDPOptimizer` draws it from a
:class:`~dpsynth_ml.dp.noise.NoiseSource` (ChaCha20 keystream with a fresh OS key per engine,
on the parameters' device, sum-of-Gaussians mitigation; see :mod:`dpsynth_ml.dp.noise`).

Noise multiplicity (DPDM, Dockhorn et al. 2023, Alg. 1; DP-DocLDM): with K > 1 each example's
loss is averaged over K independent diffusion draws *before* its one gradient is clipped, so
its contribution to the sum still has norm <= C (no extra privacy cost). The DPDM fork of
opacus replicates each example K times and averages the B*K per-row gradients inside the
optimizer, which needs K times the per-sample-gradient memory; :meth:`DpSgdEngine.
accumulate_draws` instead runs K forward/backward passes over the same micro-batch and folds
each pass's per-sample gradients into a running sum (each pass back-propagates loss / K), so
at most two [b, ...] per-sample gradients exist at a time, whatever K is. The K rows are never
clipped separately (that would give each example sensitivity K * C).

User-level DP-SGD (privacy unit ``subject``; McMahan et al. 2018, Chua et al. 2024 "Mind the
Privacy Unit!"): Poisson sampling runs over subjects (``SubjectPoissonSampler``), each
sampled subject's contribution is the mean of the per-example gradients of up to
``max_images_per_subject`` of its images, clipped ONCE (:meth:`DpSgdEngine.
accumulate_subject_draws`), and the sum over subjects gets N(0, sigma^2 C^2 I) and is divided
by the expected number of SUBJECTS per step. A subject's sensitivity is C whatever its number
of images; K draws per image fold in before the subject's single clip.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from opacus.validators import ModuleValidator
from torch import nn
from torch.optim import Optimizer

from dpsynth_ml.dp.noise import ChaChaGaussian, NoiseSource
from dpsynth_ml.dp.rows import check_gradient_rows

#: Attributes opacus attaches to each trainable parameter (untyped on ``torch.Tensor``).
_GRAD_SAMPLE = "grad_sample"
_SUMMED_GRAD = "summed_grad"


def grad_sample(p: torch.Tensor) -> torch.Tensor | list[torch.Tensor] | None:
    """opacus' per-example gradient of ``p`` (a list after backward passes with no step)."""
    value: torch.Tensor | list[torch.Tensor] | None = getattr(p, _GRAD_SAMPLE)
    return value


def set_grad_sample(p: torch.Tensor, value: torch.Tensor) -> None:
    """Replace opacus' per-example gradient of ``p``."""
    setattr(p, _GRAD_SAMPLE, value)


def summed_grad(p: torch.Tensor) -> torch.Tensor:
    """opacus' clipped sum of ``p``'s per-example gradients (set by ``clip_and_accumulate``)."""
    value: torch.Tensor = getattr(p, _SUMMED_GRAD)
    return value


def clear_summed_grad(p: torch.Tensor) -> None:
    """Drop opacus' clipped sum of ``p`` (an unreleased step)."""
    setattr(p, _SUMMED_GRAD, None)


class SourcedNoiseDPOptimizer(DPOptimizer):  # type: ignore[misc]  # opacus is untyped
    """opacus' ``DPOptimizer`` whose Gaussian noise comes from a :class:`NoiseSource`.

    opacus' own ``add_noise`` calls ``torch.normal`` on a torch generator (Mersenne Twister
    on the CPU), open to floating-point attacks unless ``secure_mode``, which needs the
    unmaintained ``torchcsprng``. Here each parameter's N(0, (sigma C)^2) noise is drawn by
    ``noise_source`` on the parameter's own device and dtype (see
    :mod:`dpsynth_ml.dp.noise`); clipping, accumulation and scaling stay opacus'.
    ``generator`` and ``secure_mode`` of opacus are not used (left at None / False).

    Args:
        optimizer, **kwargs: as for opacus ``DPOptimizer``.
        noise_source: where the noise comes from (one per engine, i.e. per attempt).
    """

    def __init__(self, optimizer: Optimizer, *, noise_source: NoiseSource,
                 **kwargs: object) -> None:
        super().__init__(optimizer, **kwargs)
        if self.generator is not None or self.secure_mode:
            raise ValueError("the noise comes from noise_source, not an opacus generator")
        self.noise_source = noise_source

    def add_noise(self) -> None:
        std = self.noise_multiplier * self.max_grad_norm
        # one draw per (device, dtype), split over the parameters in order: a draw has a
        # fixed cost (~1 ms of kernel launches on a CPU) that a UNet's hundreds of
        # parameter tensors would otherwise pay each
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for p in self.params:
            _check_processed_flag(summed_grad(p))
            groups.setdefault((summed_grad(p).device, summed_grad(p).dtype), []).append(p)
        for (device, dtype), params in groups.items():
            sizes = [summed_grad(p).numel() for p in params]
            flat = self.noise_source.gaussian((sum(sizes),), std, device=device, dtype=dtype)
            for p, noise in zip(params, torch.split(flat, sizes), strict=True):
                p.grad = (summed_grad(p) + noise.view_as(summed_grad(p))).view_as(p)
                _mark_as_processed(summed_grad(p))


class DpSgdEngine:
    """Per-example clipping and Gaussian noise for the trainable parameters of a module.

    Args:
        module: the model; its trainable parameters must all be in ``optimizer``.
        optimizer: a plain torch optimizer over exactly the trainable parameters.
        noise_multiplier: sigma > 0.
        max_grad_norm: C (flat clipping over all trainable parameters).
        expected_batch_size: public normaliser of the update.
        generator: TESTS ONLY (the injected generator of docs/privacy.md, "The noise
            source"). None, as in production: the noise is keyed with 256 fresh bits of OS
            entropy, new for every engine, i.e. every attempt. A seeded generator instead
            gives each draw a key drawn from it (:meth:`ChaChaGaussian.keyed_by`), so
            replaying it replays the noise; a model trained so is stamped ``rng: test``.
            Either way the noise is ChaCha20-based, never ``torch.normal``.
        _test_noise: TESTS ONLY: the noise source itself, in place of ChaCha20 (e.g. a
            deliberately broken one that adds nothing, to check clipping and sums exactly).
            No spec, API field or setting reaches it: it is an object only test code builds.

    Raises:
        ValueError: if sigma is not > 0, opacus' validators reject the module (e.g.
            BatchNorm, trainable layers with buffers) or the optimizer does not hold exactly
            the trainable params.
    """

    def __init__(self, module: nn.Module, optimizer: Optimizer, *, noise_multiplier: float,
                 max_grad_norm: float, expected_batch_size: int,
                 generator: torch.Generator | None = None,
                 _test_noise: NoiseSource | None = None) -> None:
        if not noise_multiplier > 0:
            raise ValueError("noise_multiplier must be > 0 (tests inject a noise source)")
        errors = ModuleValidator.validate(module, strict=False)
        if errors:
            raise ValueError(f"module is not DP-compatible: {errors}")
        trainable = {id(p) for p in module.parameters() if p.requires_grad}
        in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if trainable != in_optimizer:
            raise ValueError("optimizer must hold exactly the module's trainable parameters")
        self.max_grad_norm = max_grad_norm
        self.noise_source: NoiseSource = (
            _test_noise if _test_noise is not None
            else ChaChaGaussian.from_os_entropy() if generator is None
            else ChaChaGaussian.keyed_by(generator))
        # loss_reduction="sum": we back-propagate the sum of per-example losses so that
        # grad_sample[i] is exactly example i's gradient; normalisation happens once, in the
        # optimizer, by expected_batch_size.
        self.module = GradSampleModule(module, batch_first=True, loss_reduction="sum",
                                       strict=True)
        self.optimizer = self._dp_optimizer(optimizer, noise_multiplier=noise_multiplier,
                                            max_grad_norm=max_grad_norm,
                                            expected_batch_size=expected_batch_size,
                                            noise_source=self.noise_source)
        # user-level DP-SGD: a subject's partial contribution carried across micro-batches
        self._carried: list[torch.Tensor] | None = None

    def _dp_optimizer(self, optimizer: Optimizer, *, noise_multiplier: float,
                      max_grad_norm: float, expected_batch_size: int,
                      noise_source: NoiseSource) -> DPOptimizer:
        """The opacus optimizer that clips, noises and normalises (overridden for ranks)."""
        return SourcedNoiseDPOptimizer(optimizer, noise_multiplier=noise_multiplier,
                                       max_grad_norm=max_grad_norm,
                                       expected_batch_size=expected_batch_size,
                                       loss_reduction="mean", noise_source=noise_source)

    @property
    def params(self) -> Sequence[nn.Parameter]:
        """The parameters this engine clips, noises and updates."""
        return list(self.optimizer.params)

    def accumulate(self, per_sample_loss: torch.Tensor) -> int:
        """Back-propagate one physical micro-batch, clip each example, add to the sum.

        Args:
            per_sample_loss: loss per example [b], computed through ``self.module``.

        Returns:
            How many examples of the micro-batch had a gradient norm above C (private).
        """
        self._backward(per_sample_loss.sum())
        return self._clip_and_sum()

    def accumulate_draws(self, draw_losses: Callable[[], torch.Tensor],
                         draws: int) -> tuple[int, torch.Tensor]:
        """Noise multiplicity: clip each example's gradient averaged over ``draws`` draws.

        Calls ``draw_losses`` ``draws`` times; each call must compute, through
        ``self.module``, the per-example losses [b] of the *same* micro-batch with fresh
        randomness (timesteps, noise). Example i's gradient is then
        ``(1/K) sum_k grad l_ik`` = the gradient of its K-draw mean loss, and it is clipped
        once to C and added to the sum. Per-sample-gradient memory is two [b, ...] tensors
        per parameter (the running sum and the current pass), independent of K.

        Args:
            draw_losses: computes one draw of the micro-batch's per-example losses [b].
            draws: K >= 1.

        Returns:
            (how many examples had a mean-gradient norm above C, the K-draw mean loss per
            example [b], detached). Both are private statistics.

        Raises:
            ValueError: if ``draws < 1``.
        """
        mean_loss = self._draw_passes(draw_losses, draws)
        return self._clip_and_sum(), mean_loss

    def accumulate_subject_draws(self, draw_losses: Callable[[], torch.Tensor], draws: int,
                                 groups: torch.Tensor, weights: torch.Tensor, *,
                                 carry_in: bool = False,
                                 carry_out: bool = False) -> tuple[int, torch.Tensor]:
        """User-level DP-SGD: fold a micro-batch's per-example gradients into per-SUBJECT
        contributions, clip each subject's contribution ONCE to C and add it to the sum.

        Each example's gradient is first its K-draw mean (as :meth:`accumulate_draws`);
        then subject j's contribution is ``sum_{i in j} weights[i] * g_i`` (the caller
        passes ``1 / n_j`` for the mean over the subject's n_j sampled images), and only
        that vector is clipped. Removing a subject therefore changes the clipped sum by at
        most C, however many images it has.

        A subject's images may span consecutive micro-batches: ``carry_out`` keeps the last
        group's partial contribution (one row per parameter) unclipped for the next call,
        whose ``carry_in`` adds it to its first group. Per-sample-gradient memory is the
        micro-batch's [b, ...] rows, its [g <= b, ...] subject rows and one carried row.

        Args:
            draw_losses: computes one draw of the micro-batch's per-example losses [b].
            draws: K >= 1.
            groups: [b] ascending subject ordinals local to this micro-batch (0..g-1).
            weights: [b] each example's weight in its subject's contribution.
            carry_in: the first group continues the previous call's carried subject.
            carry_out: the last group continues in the next call (not clipped yet).

        Returns:
            (how many subjects completed here had a contribution norm above C, the K-draw
            mean loss per example [b], detached). Both are private statistics.
        """
        if groups.numel() == 0:
            raise ValueError("a micro-batch needs at least one example")
        mean_loss = self._draw_passes(draw_losses, draws)
        num_groups = int(groups.max().item()) + 1
        carried: list[torch.Tensor] = []
        for index, p in enumerate(self.params):
            gs = grad_sample(p)
            assert isinstance(gs, torch.Tensor)
            w = weights.to(device=gs.device, dtype=gs.dtype).view(-1, *([1] * (gs.dim() - 1)))
            grouped = torch.zeros((num_groups, *gs.shape[1:]), dtype=gs.dtype,
                                  device=gs.device)
            grouped.index_add_(0, groups.to(gs.device), gs * w)
            if carry_in:
                if self._carried is None:
                    raise RuntimeError("carry_in without a carried subject")
                grouped[0] += self._carried[index]
            if carry_out:
                carried.append(grouped[-1].clone())
                grouped = grouped[:-1]
            set_grad_sample(p, grouped)
        self._carried = carried if carry_out else None
        return self._clip_and_sum(), mean_loss

    def accumulate_gradients(self, rows: Sequence[torch.Tensor]) -> int:
        """Clip explicit per-unit rows (one [n, *p.shape] tensor per trainable parameter,
        :attr:`params` order) through opacus' own clipping and add them to the step's sum:
        the white-box audit's canaries (issue 19). Returns how many had a norm above C."""
        if self._carried is not None:
            raise RuntimeError("a subject's contribution is carried: finish it first")
        checked = check_gradient_rows(rows, self.params)
        if not checked[0].shape[0]:
            return 0
        for p, r in zip(self.params, checked, strict=True):
            set_grad_sample(p, r)
        return self._clip_and_sum()

    def _draw_passes(self, draw_losses: Callable[[], torch.Tensor], draws: int) -> torch.Tensor:
        """K forward/backward passes folded into one per-example gradient (the K-draw mean
        gradient in ``p.grad_sample``); returns the K-draw mean loss per example."""
        if draws < 1:
            raise ValueError("draws must be >= 1")
        mean_loss: torch.Tensor | None = None
        for _ in range(draws):
            losses = draw_losses()
            # loss / K: the per-sample gradients of the K passes then *sum* to the mean.
            self._backward(losses.sum() / draws)
            self._fold_grad_samples()
            detached = losses.detach() / draws
            mean_loss = detached if mean_loss is None else mean_loss + detached
        assert mean_loss is not None
        return mean_loss

    def _backward(self, loss: torch.Tensor) -> None:
        with warnings.catch_warnings():
            # The class embedder's input (integer labels) never requires grad, so torch
            # warns that opacus' full backward hook fires on outputs only; that is expected.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward

    def _fold_grad_samples(self) -> None:
        """Sum this pass's per-sample gradients into the previous passes' (same examples).

        After a second backward without an optimizer step, opacus keeps ``grad_sample`` as a
        list [earlier, this pass] (its gradient-accumulation mode, which would treat the
        passes as *more examples*); the rows belong to the same examples, so add them.
        """
        for p in self.params:
            gs = grad_sample(p)
            if isinstance(gs, list):
                total = gs[0]
                for more in gs[1:]:
                    total = total.add_(more)
                set_grad_sample(p, total)

    def _clip_and_sum(self) -> int:
        """Clip each example's (folded) gradient to C and add it to ``p.summed_grad``."""
        norms = self.per_sample_norms()
        # Skip = clip and accumulate into p.summed_grad only; no noise, no update yet.
        self.optimizer.signal_skip_step(True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return int((norms > self.max_grad_norm).sum().item())

    def per_sample_norms(self) -> torch.Tensor:
        """Flat L2 norm of each example's gradient over all trainable parameters, float64.

        ``sqrt(sum_p ||g_i(p)||^2)`` with the squares summed in float64, one parameter at a
        time (a float64 copy of one parameter's rows at most): the ``fraction_clipped``
        statistic compares it with C, and opacus' float32 norm of per-parameter norms is
        off by ~1e-4 relative on a UNet. Clipping itself stays opacus' (float32) factor.
        """
        # no rows (a micro-batch whose only subject carries on): norms of shape [0]
        grads: list[torch.Tensor] = self.optimizer.grad_samples
        if not grads:
            return torch.zeros(0, dtype=torch.float64)
        squares = torch.zeros(len(grads[0]), dtype=torch.float64, device=grads[0].device)
        for g in grads:
            if g.numel():
                squares += torch.linalg.vector_norm(
                    g.reshape(len(g), -1), dim=1, dtype=torch.float64).square().to(
                        squares.device)
        return squares.sqrt()

    @property
    def original_optimizer(self) -> Optimizer:
        """The plain torch optimizer that applies the private gradient."""
        optimizer: Optimizer = self.optimizer.original_optimizer
        return optimizer

    def privatize(self) -> None:
        """Finish a logical step: add noise once to the clipped sum, divide by B_expected.

        Leaves the private gradient in ``p.grad``. Works for an empty logical batch: the
        clipped sum is then zero and the step is pure noise (it is still a step that the
        accountant counts, so it must be taken).
        """
        if self._carried is not None:
            raise RuntimeError("a subject's contribution was carried but never completed")
        for p in self.params:
            # An empty per-sample gradient makes DPOptimizer treat "no more examples" and
            # "empty Poisson batch" alike: clip_and_accumulate adds a zero-sized sum.
            set_grad_sample(p, torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device))
        if not self.optimizer.pre_step():
            raise RuntimeError("DPOptimizer skipped the noise step unexpectedly")

    def apply_update(self) -> None:
        """Apply the underlying optimizer to the private gradient and clear all grads."""
        self.optimizer.original_optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def discard(self) -> None:
        """Drop the accumulated (unreleased) state without updating (tests, aborts)."""
        for p in self.params:
            clear_summed_grad(p)
        self._carried = None
        self.optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Remove opacus hooks and per-sample attributes from the wrapped module."""
        self.discard()
        self.module._close()
