"""The leased step loop every DP trainer runs (finetunes, ``dp_train``): the platform charges
the privacy budget of a chunk of steps when it grants them, before any of them runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dpsynth_ml.training.hooks import TrainingHooks


def leased_steps(*, total: int, start: int, every: int, hooks: TrainingHooks,
                 step: Callable[[], Mapping[str, float]],
                 checkpoint: Callable[[int], None]) -> tuple[int, bool]:
    """Run logical steps ``start..total-1`` leased in chunks of ``every``.

    Before each chunk, ``hooks.acquire_steps`` is asked for it (what is granted is charged
    then); ``step()`` runs one logical step and returns its owner-only statistics (passed to
    ``hooks.on_private_stats``); ``checkpoint(n)`` is called at each chunk's end and at the
    last step. Returns (steps done, stopped early): stopped when the hooks say stop, or
    grant nothing.
    """
    done = start
    while done < total:
        if hooks.should_stop():
            return done, True
        wanted = min(every, total - done)
        # The platform charges privacy budget here, before any of these steps run.
        granted = max(0, min(int(hooks.acquire_steps(done, wanted)), wanted))
        if granted == 0:
            return done, True
        for i in range(granted):
            if i > 0 and hooks.should_stop():
                return done, True
            hooks.on_private_stats(step())
            done += 1
            hooks.on_progress(done, total)
            if done % every == 0 or done == total:
                checkpoint(done)
    return done, False
