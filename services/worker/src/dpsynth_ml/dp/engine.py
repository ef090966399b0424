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
noise once and divides by the *expected* batch size, never by the realised one.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from torch import nn
from torch.optim import Optimizer


class DpSgdEngine:
    """Per-example clipping and Gaussian noise for the trainable parameters of a module.

    Args:
        module: the model; its trainable parameters must all be in ``optimizer``.
        optimizer: a plain torch optimizer over exactly the trainable parameters.
        noise_multiplier: sigma.
        max_grad_norm: C (flat clipping over all trainable parameters).
        expected_batch_size: public normaliser of the update.
        generator: source of the Gaussian noise (the per-attempt generator).

    Raises:
        ValueError: if opacus' validators reject the module (e.g. BatchNorm, trainable
            layers with buffers) or the optimizer does not hold exactly the trainable params.
    """

    def __init__(self, module: nn.Module, optimizer: Optimizer, *, noise_multiplier: float,
                 max_grad_norm: float, expected_batch_size: int,
                 generator: torch.Generator) -> None:
        errors = ModuleValidator.validate(module, strict=False)
        if errors:
            raise ValueError(f"module is not DP-compatible: {errors}")
        trainable = {id(p) for p in module.parameters() if p.requires_grad}
        in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if trainable != in_optimizer:
            raise ValueError("optimizer must hold exactly the module's trainable parameters")
        self.max_grad_norm = max_grad_norm
        # loss_reduction="sum": we back-propagate the sum of per-example losses so that
        # grad_sample[i] is exactly example i's gradient; normalisation happens once, in the
        # optimizer, by expected_batch_size.
        self.module = GradSampleModule(module, batch_first=True, loss_reduction="sum",
                                       strict=True)
        self.optimizer = DPOptimizer(optimizer, noise_multiplier=noise_multiplier,
                                     max_grad_norm=max_grad_norm,
                                     expected_batch_size=expected_batch_size,
                                     loss_reduction="mean", generator=generator)

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
        with warnings.catch_warnings():
            # The class embedder's input (integer labels) never requires grad, so torch
            # warns that opacus' full backward hook fires on outputs only; that is expected.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            per_sample_loss.sum().backward()
        norms = self.per_sample_norms()
        # Skip = clip and accumulate into p.summed_grad only; no noise, no update yet.
        self.optimizer.signal_skip_step(True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return int((norms > self.max_grad_norm).sum().item())

    def per_sample_norms(self) -> torch.Tensor:
        """Flat L2 norm of each example's gradient over all trainable parameters."""
        flat = [g.reshape(len(g), -1) for g in self.optimizer.grad_samples]
        return torch.cat(flat, dim=1).norm(2, dim=1)

    def privatize(self) -> None:
        """Finish a logical step: add noise once to the clipped sum, divide by B_expected.

        Leaves the private gradient in ``p.grad``. Works for an empty logical batch: the
        clipped sum is then zero and the step is pure noise (it is still a step that the
        accountant counts, so it must be taken).
        """
        for p in self.params:
            # An empty per-sample gradient makes DPOptimizer treat "no more examples" and
            # "empty Poisson batch" alike: clip_and_accumulate adds a zero-sized sum.
            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
        if not self.optimizer.pre_step():
            raise RuntimeError("DPOptimizer skipped the noise step unexpectedly")

    def apply_update(self) -> None:
        """Apply the underlying optimizer to the private gradient and clear all grads."""
        self.optimizer.original_optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def discard(self) -> None:
        """Drop the accumulated (unreleased) state without updating (tests, aborts)."""
        for p in self.params:
            p.summed_grad = None
        self.optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Remove opacus hooks and per-sample attributes from the wrapped module."""
        self.discard()
        self.module._close()
