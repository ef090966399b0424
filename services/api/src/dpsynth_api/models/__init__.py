"""Models: uploaded diffusers folders (safetensors only) and models produced by jobs."""
