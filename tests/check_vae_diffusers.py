"""retrace's VAE decoder against diffusers' AutoencoderKL, the implementation DiT's sample.py and
the Stable Diffusion pipelines decode with.

A randomly initialised AutoencoderKL (diffusers' layout, its encoder included, every parameter
perturbed so norms and biases are not trivial) is saved as diffusers saves it
(diffusion_pytorch_model.safetensors); random latents go through diffusers' decoder in float64
(the reference) and float32, and through `retrace decode` in float32 and bfloat16. The errors are
the largest |difference| over the reference's largest |value|:

    retrace float32   <= 1e-5
    retrace bfloat16  <= 3e-2

(diffusers' own float32 and bfloat16 errors are printed beside them), and the 8-bit images (torchvision's save_image mapping) of retrace float32 and diffusers float32
differ by at most one level. Exits 77 (skipped) when torch or diffusers is not installed
(scripts/peers-env.sh installs both into .venv-peers).

    python tests/check_vae_diffusers.py --retrace build/bin/retrace --workdir /tmp/vae [--sd]
"""
import argparse
import pathlib
import subprocess
import sys

import numpy as np

try:
    import torch
    from diffusers import AutoencoderKL
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"check_vae_diffusers: skipped: {e}")
    sys.exit(77)

SCALING = 0.18215


def build_vae(sd_size: bool) -> "AutoencoderKL":
    torch.manual_seed(0)
    if sd_size:  # the published Stable Diffusion VAE's architecture (83M parameters)
        blocks, layers = (128, 256, 512, 512), 2
    else:  # small: three blocks (4x upscale), widths changing, 32 groups as published
        blocks, layers = (32, 64, 64), 1
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=blocks,
        layers_per_block=layers, norm_num_groups=32,
        down_block_types=("DownEncoderBlock2D",) * len(blocks),
        up_block_types=("UpDecoderBlock2D",) * len(blocks))
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if p.dim() == 1:  # norms' scales and shifts, biases
                p.add_(0.1 * torch.randn_like(p))
    return vae.eval()


def pixels(image: np.ndarray) -> np.ndarray:
    """torchvision's save_image with value_range (-1, 1), in float32 as it computes."""
    x = np.clip(image.astype(np.float32), -1, 1)
    x = (x + np.float32(1)) / np.float32(2)
    return np.clip(x * np.float32(255) + np.float32(0.5), 0, 255).astype(np.uint8)


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--retrace", required=True, help="the retrace command line")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--sd", action="store_true",
                        help="the Stable Diffusion VAE's size (slow) instead of a small one")
    parser.add_argument("--latent-size", type=int, default=None)
    args = parser.parse_args()
    work = pathlib.Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)

    vae = build_vae(args.sd)
    vae.save_pretrained(work / "vae", safe_serialization=True)
    weights = work / "vae" / "diffusion_pytorch_model.safetensors"
    size = args.latent_size or (8 if args.sd else 6)
    rng = np.random.default_rng(1)
    latents = rng.standard_normal((2, 4, size, size + 1)).astype(np.float32)
    np.save(work / "latents.npy", latents)

    with torch.no_grad():
        z = torch.from_numpy(latents)
        reference = vae.double().decode(z.double() / SCALING).sample.numpy()
        diffusers32 = vae.float().decode(z / SCALING).sample.numpy()
        diffusers16 = vae.to(torch.bfloat16).decode(
            (z / SCALING).to(torch.bfloat16)).sample.float().numpy()

    results = {}
    for dtype in ("float32", "bfloat16"):
        out = work / f"retrace_{dtype}.npy"
        run = subprocess.run(
            [args.retrace, "decode", "--vae", str(weights), "--latents", str(work / "latents.npy"),
             "--dtype", dtype, "--replays", "1", "--out", str(work / f"retrace_{dtype}.png"),
             "--save-image", str(out)],
            capture_output=True, text=True)
        print(run.stdout, end="")
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return 1
        results[dtype] = np.load(out)

    ok = True
    limits = {"float32": 1e-5, "bfloat16": 3e-2}
    print(f"check_vae_diffusers: latents {latents.shape}, image {reference.shape}; "
          f"error = max |x - float64 reference| / max |reference|")
    print(f"  diffusers float32: {relative(diffusers32, reference):.2e}")
    print(f"  diffusers bfloat16: {relative(diffusers16, reference):.2e}")
    for dtype, image in results.items():
        if image.shape != reference.shape:
            print(f"  retrace {dtype}: shape {image.shape} != {reference.shape}")
            ok = False
            continue
        error = relative(image, reference)
        verdict = "ok" if error <= limits[dtype] else "FAIL"
        print(f"  retrace {dtype:9s}: {error:.2e} (limit {limits[dtype]:.0e}) {verdict}")
        ok = ok and error <= limits[dtype]
    levels = np.abs(pixels(results["float32"]).astype(int) - pixels(diffusers32).astype(int))
    print(f"  8-bit images, retrace float32 vs diffusers float32: largest difference "
          f"{levels.max()} level(s), {np.count_nonzero(levels)} of {levels.size} values differ")
    ok = ok and levels.max() <= 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
