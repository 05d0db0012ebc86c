"""retrace.models: the Stable Diffusion VAE decoder and the model files, from the C++ library.

`VaeDecoder(path, device, dtype=None)` loads a diffusers AutoencoderKL file (the published
stabilityai/sd-vae-ft-ema and -mse files as they are); `decode(latents)` turns sampler latents
[B, C, h, w] into images [B, 3, 8h, 8w]; `vae_image(image, i)` maps one to 8-bit RGB as
torchvision's save_image does, `write_png` writes it; `read_npy` / `write_npy` move latents to and
from NumPy files. Wrap `decode` in a traced function or a Tracer to replay it.
"""

from ._core.models import VaeDecoder, read_npy, vae_decode_bytes, vae_image, write_npy, write_png

__all__ = ["VaeDecoder", "read_npy", "vae_decode_bytes", "vae_image", "write_npy", "write_png"]
