"""The model room: architectures (presets, custom diffusers configs, the conditional
denoiser), the on-disk model format (``model_io``) and the trainable-set selection
(``trainable``)."""
