"""The training room: the ``train`` entry point (``entry``), pretraining, the DP finetune
(``finetune``: setup, loop, checkpoints), per-label finetunes, the hooks protocol, trainer
checkpoints, the diffusion objective and the fixed-cost encoding of padded rows."""
