"""python -m retrace.demo: class-conditional DiT sampling written in Python on retrace.ops.

The same model and loop as the C++ `retrace demo` (random weights, DDIM steps with
classifier-free guidance), run eagerly and traced (a traced_function method, one trace per
resolution selected by tracer_trace_key), with StateTensors for the timestep, the step's
coefficients and the latents. With --vae, the final latents are decoded by the Stable Diffusion
VAE (retrace.models, traced per resolution) and the image written (--out). Exits 1 if the
traced and eager final latents, or decoded images, differ in any bit.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

import retrace
import retrace.models
from retrace import ops


@dataclass
class DiTConfig:
    input_size: int = 32
    patch_size: int = 2
    in_channels: int = 4
    hidden: int = 256
    depth: int = 4
    heads: int = 4
    num_classes: int = 1000
    mlp_ratio: float = 4.0
    learn_sigma: bool = True
    frequency_size: int = 256
    seed: int = 0

    @property
    def grid(self) -> int:
        return self.input_size // self.patch_size

    @property
    def out_channels(self) -> int:
        return self.in_channels * (2 if self.learn_sigma else 1)

    @property
    def mlp_width(self) -> int:
        return int(self.hidden * self.mlp_ratio)


def sincos_positions(hidden: int, grid_h: int, grid_w: int) -> np.ndarray:
    """The reference's fixed 2-D sin-cos table [1, grid_h * grid_w, hidden] (columns first)."""
    quarter = hidden // 4
    omega = 1.0 / 10000.0 ** (np.arange(quarter, dtype=np.float64) / quarter)

    def encode(pos: np.ndarray) -> np.ndarray:
        angles = pos[:, None] * omega[None, :]
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    table = np.concatenate([encode(cols.reshape(-1).astype(np.float64)),
                            encode(rows.reshape(-1).astype(np.float64))], axis=1)
    return table.astype(np.float32)[None]


class DiT:
    """A diffusion transformer with adaLN-Zero blocks, in the reference's tensor names."""

    def __init__(self, config: DiTConfig, device: retrace.Device, dtype=retrace.float32):
        self.config, self.device, self.dtype = config, device, dtype
        rng = np.random.default_rng(config.seed)
        self.weights: dict[str, retrace.Tensor] = {}
        self._positions: dict[tuple[int, int], retrace.Tensor] = {}
        for name, shape in self.weight_shapes(config):
            if name == "pos_embed":
                values = sincos_positions(config.hidden, config.grid, config.grid)
            else:
                bias = name.endswith(".bias")
                fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
                std = 0.02 if bias else 1.0 / math.sqrt(fan_in)
                if name.startswith("y_embedder"):
                    std = 0.02
                if "adaLN" in name or name.startswith("final_layer"):
                    std *= 0.1
                values = rng.normal(0.0, std, size=shape).astype(np.float32)
            self.weights[name] = retrace.from_numpy(values, device=device, dtype=dtype)

    @staticmethod
    def weight_shapes(c: DiTConfig) -> list[tuple[str, tuple[int, ...]]]:
        h, p, m = c.hidden, c.patch_size, c.mlp_width
        shapes = [
            ("pos_embed", (1, c.grid * c.grid, h)),
            ("x_embedder.proj.weight", (h, c.in_channels, p, p)),
            ("x_embedder.proj.bias", (h,)),
            ("t_embedder.mlp.0.weight", (h, c.frequency_size)),
            ("t_embedder.mlp.0.bias", (h,)),
            ("t_embedder.mlp.2.weight", (h, h)),
            ("t_embedder.mlp.2.bias", (h,)),
            ("y_embedder.embedding_table.weight", (c.num_classes + 1, h)),
        ]
        for i in range(c.depth):
            b = f"blocks.{i}."
            shapes += [
                (b + "attn.qkv.weight", (3 * h, h)), (b + "attn.qkv.bias", (3 * h,)),
                (b + "attn.proj.weight", (h, h)), (b + "attn.proj.bias", (h,)),
                (b + "mlp.fc1.weight", (m, h)), (b + "mlp.fc1.bias", (m,)),
                (b + "mlp.fc2.weight", (h, m)), (b + "mlp.fc2.bias", (h,)),
                (b + "adaLN_modulation.1.weight", (6 * h, h)),
                (b + "adaLN_modulation.1.bias", (6 * h,)),
            ]
        shapes += [
            ("final_layer.linear.weight", (p * p * c.out_channels, h)),
            ("final_layer.linear.bias", (p * p * c.out_channels,)),
            ("final_layer.adaLN_modulation.1.weight", (2 * h, h)),
            ("final_layer.adaLN_modulation.1.bias", (2 * h,)),
        ]
        return shapes

    # --- host-side inputs -------------------------------------------------------------------
    def timestep_frequencies(self, t: float) -> np.ndarray:
        half = self.config.frequency_size // 2
        freqs = np.exp(-math.log(10000.0) * np.arange(half, dtype=np.float64) / half)
        args = float(t) * freqs
        return np.concatenate([np.cos(args), np.sin(args)]).astype(np.float32)[None]

    def label_rows(self, labels: list[int]) -> np.ndarray:
        rows = np.zeros((len(labels), self.config.num_classes + 1), np.float32)
        for i, label in enumerate(labels):
            if not 0 <= label <= self.config.num_classes:
                raise retrace.InvalidArgument(
                    f"DiT: class label {label} is outside [0, {self.config.num_classes}]")
            rows[i, label] = 1.0
        return rows

    def positions(self, grid_h: int, grid_w: int) -> retrace.Tensor:
        c = self.config
        if (grid_h, grid_w) == (c.grid, c.grid):
            return self.weights["pos_embed"]
        if (grid_h, grid_w) not in self._positions:
            self._positions[(grid_h, grid_w)] = retrace.from_numpy(
                sincos_positions(c.hidden, grid_h, grid_w), device=self.device, dtype=self.dtype)
        return self._positions[(grid_h, grid_w)]

    # --- the network ------------------------------------------------------------------------
    @staticmethod
    def modulate(x, shift, scale):
        return ops.add(ops.mul(x, ops.add(scale, 1.0)), shift)

    def block(self, x, cond, i: int):
        c = self.config
        h, heads = c.hidden, c.heads
        d = h // heads
        batch, tokens = x.shape[0], x.shape[1]
        w = self.weights
        b = f"blocks.{i}."
        mod = ops.chunk(ops.linear(cond, w[b + "adaLN_modulation.1.weight"],
                                   w[b + "adaLN_modulation.1.bias"]), 6, -1)
        y = self.modulate(ops.layer_norm(x, eps=1e-6), mod[0], mod[1])
        qkv = ops.linear(y, w[b + "attn.qkv.weight"], w[b + "attn.qkv.bias"])
        qkv = ops.permute(ops.reshape(qkv, (batch, tokens, 3, heads, d)), (2, 0, 3, 1, 4))
        q, k, v = (ops.reshape(part, (batch, heads, tokens, d)) for part in ops.chunk(qkv, 3, 0))
        attn = ops.scaled_dot_product_attention(q, k, v)
        attn = ops.reshape(ops.permute(attn, (0, 2, 1, 3)), (batch, tokens, h))
        attn = ops.linear(attn, w[b + "attn.proj.weight"], w[b + "attn.proj.bias"])
        out = ops.add(x, ops.mul(attn, mod[2]))
        y = self.modulate(ops.layer_norm(out, eps=1e-6), mod[3], mod[4])
        y = ops.gelu_tanh(ops.linear(y, w[b + "mlp.fc1.weight"], w[b + "mlp.fc1.bias"]))
        y = ops.linear(y, w[b + "mlp.fc2.weight"], w[b + "mlp.fc2.bias"])
        return ops.add(out, ops.mul(y, mod[5]))

    def forward(self, latents, t_frequencies, labels):
        c = self.config
        h, p = c.hidden, c.patch_size
        batch, channels, height, width = latents.shape
        gh, gw = height // p, width // p
        tokens = gh * gw
        w = self.weights
        patches = ops.permute(ops.reshape(latents, (batch, channels, gh, p, gw, p)),
                              (0, 2, 4, 1, 3, 5))
        patches = ops.reshape(patches, (batch, tokens, channels * p * p))
        x = ops.linear(patches, ops.reshape(w["x_embedder.proj.weight"], (h, channels * p * p)),
                       w["x_embedder.proj.bias"])
        x = ops.add(x, self.positions(gh, gw))
        temb = ops.linear(t_frequencies, w["t_embedder.mlp.0.weight"], w["t_embedder.mlp.0.bias"])
        temb = ops.linear(ops.silu(temb), w["t_embedder.mlp.2.weight"], w["t_embedder.mlp.2.bias"])
        yemb = ops.matmul(labels, w["y_embedder.embedding_table.weight"])
        cond = ops.reshape(ops.silu(ops.add(temb, yemb)), (batch, 1, h))
        for i in range(c.depth):
            x = self.block(x, cond, i)
        mod = ops.chunk(ops.linear(cond, w["final_layer.adaLN_modulation.1.weight"],
                                   w["final_layer.adaLN_modulation.1.bias"]), 2, -1)
        x = self.modulate(ops.layer_norm(x, eps=1e-6), mod[0], mod[1])
        x = ops.linear(x, w["final_layer.linear.weight"], w["final_layer.linear.bias"])
        out = c.out_channels
        x = ops.permute(ops.reshape(x, (batch, gh, gw, p, p, out)), (0, 5, 1, 3, 2, 4))
        return ops.reshape(x, (batch, out, gh * p, gw * p))

    def guided_noise(self, latents, t_frequencies, labels, cfg_scale: float):
        channels = self.config.in_channels
        if cfg_scale == 1.0:
            return ops.slice(self.forward(latents, t_frequencies, labels), 1, 0, channels)
        batch = latents.shape[0]
        eps = ops.slice(self.forward(ops.concat([latents, latents], 0), t_frequencies, labels),
                        1, 0, channels)
        cond, uncond = ops.slice(eps, 0, 0, batch), ops.slice(eps, 0, batch, 2 * batch)
        return ops.add(uncond, ops.mul(ops.sub(cond, uncond), cfg_scale))

    @retrace.traced_function(device=lambda self: self.device, name="DiT.sample_step")
    def sample_step(self, latents, t_frequencies, labels, coefficients, cfg_scale: float):
        """One DDIM step: x_next = a * x + b * eps, (a, b) = coefficients [2]."""
        a, b = ops.chunk(coefficients, 2, 0)
        eps = self.guided_noise(latents, t_frequencies, labels, cfg_scale)
        return ops.add(ops.mul(latents, a), ops.mul(eps, b))


def ddim_schedule(steps: int) -> tuple[list[float], list[tuple[float, float]]]:
    """The reference diffusion's DDIM (eta 0) timesteps and per-step (a, b)."""
    train = 1000
    if not 1 <= steps <= train:
        raise retrace.InvalidArgument(f"DDIM: steps must be from 1 to {train}, got {steps}")
    betas = 1e-4 + (0.02 - 1e-4) * np.arange(train, dtype=np.float64) / (train - 1)
    abar = np.cumprod(1.0 - betas)
    kept: list[int] = []
    for stride in range(1, train + 1):
        if (train + stride - 1) // stride == steps:
            kept = list(range(0, train, stride))
            break
    if not kept:
        kept = [k * train // steps for k in range(steps)]
    kept.reverse()
    timesteps, coefficients = [], []
    for i, t in enumerate(kept):
        now = abar[t]
        nxt = abar[kept[i + 1]] if i + 1 < len(kept) else 1.0
        timesteps.append(float(np.float32(t)))
        coefficients.append((math.sqrt(nxt / now),
                             math.sqrt(1.0 - nxt) - math.sqrt(nxt * (1.0 - now) / now)))
    return timesteps, coefficients


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retrace.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--input-size", type=int, default=32)
    parser.add_argument("--patch", type=int, default=2)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--class", dest="label", type=int, default=-1)
    parser.add_argument("--cfg-scale", type=float, default=4.0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vae", help="decode the final latents with this VAE (diffusers "
                        "AutoencoderKL .safetensors) and write the image")
    parser.add_argument("--out", default="dit_sample.png", help="with --vae: the image (PNG)")
    args = parser.parse_args(argv)

    config = DiTConfig(input_size=args.input_size, patch_size=args.patch,
                       in_channels=args.channels, hidden=args.hidden, depth=args.depth,
                       heads=args.heads, num_classes=args.classes, seed=args.seed)
    if config.hidden % config.heads or config.hidden % 4 or config.input_size % config.patch_size:
        parser.error("hidden must be a multiple of 4 and of heads, input size a multiple of patch")
    dtype = retrace.DType.__members__[args.dtype]
    memory = trace_memory = None
    if args.vae is not None:
        # The device holds the largest decode eagerly and traced (as the C++ demo sizes it).
        decode = retrace.models.vae_decode_bytes(
            args.vae, [1, config.in_channels, config.input_size, config.input_size], dtype)
        memory = (1 << 30) + 3 * decode
        trace_memory = (256 << 20) + decode + decode // 2
    device = retrace.open_device(args.device, memory=memory, trace_memory=trace_memory)
    model = DiT(config, device, dtype)
    vae = None
    if args.vae is not None:
        vae = retrace.models.VaeDecoder(args.vae, device, dtype)
        if vae.latent_channels != config.in_channels:
            parser.error(f"--vae {args.vae} decodes {vae.latent_channels}-channel latents; "
                         f"the DiT makes {config.in_channels}-channel ones")

    @retrace.traced_function(name="VAE decode")
    def decode(latents, device):
        assert vae is not None
        return vae.decode(latents)

    label = args.label if args.label >= 0 else (207 if config.num_classes > 207 else 0)
    if label >= config.num_classes:
        parser.error(f"--class {label}: the model has {config.num_classes} classes")
    guided = args.cfg_scale != 1.0
    batch = 2 if guided else 1
    timesteps, coefficients = ddim_schedule(args.steps)
    print(f"retrace demo (Python): DiT ({config.in_channels}x{config.input_size}x"
          f"{config.input_size} latents, patch {config.patch_size}, hidden {config.hidden}, "
          f"depth {config.depth}, heads {config.heads}, {config.num_classes} classes, "
          f"{args.dtype}, random weights) on {device.name}")
    guidance = (f"classifier-free guidance scale {args.cfg_scale:g} (batch of 2)" if guided
                else "no guidance")
    print(f"  {args.steps} DDIM steps, class {label}, {guidance}")
    if vae is not None:
        print(f"  VAE decoder {args.vae} (blocks {list(vae.block_out_channels)}, "
              f"{vae.layers_per_block} layers per block, {args.dtype}): {vae.upscale}x upscale")

    sizes = [config.input_size]
    half = config.input_size // 2
    if half >= config.patch_size and half % config.patch_size == 0:
        sizes.append(half)
    labels = retrace.from_numpy(
        model.label_rows([label, config.num_classes] if guided else [label]),
        device=device, dtype=dtype)
    results = []
    for size in sizes:
        key = f"{size}x{size}"
        tokens = (size // config.patch_size) ** 2
        print(f'{key} latents, {tokens} tokens (trace key "{key}"):')
        rng = np.random.default_rng(config.seed * 7919 + size)
        start = rng.standard_normal((1, config.in_channels, size, size)).astype(np.float32)

        eager_ms = []
        x = retrace.from_numpy(start, device=device, dtype=dtype)
        for i in range(args.steps):
            t0 = time.perf_counter()
            tf = retrace.from_numpy(model.timestep_frequencies(timesteps[i]), device=device,
                                    dtype=dtype)
            ab = retrace.from_numpy(np.array(coefficients[i], np.float32), device=device,
                                    dtype=dtype)
            x = model.sample_step(x, tf, labels, ab, args.cfg_scale)
            device.synchronize()
            eager_ms.append((time.perf_counter() - t0) * 1e3)
        eager_final = x.numpy()
        print(f"  eager   median {np.median(eager_ms):.2f} ms/step")

        traced_ms, capture_ms = [], 0.0
        timestep, coeffs, latents = (retrace.StateTensor() for _ in range(3))
        latents.update(retrace.from_numpy(start, device=device, dtype=dtype), traced=True)
        for i in range(args.steps):
            t0 = time.perf_counter()
            timestep.update(model.timestep_frequencies(timesteps[i]), traced=True, dtype=dtype,
                            device=device)
            coeffs.update(np.array(coefficients[i], np.float32), traced=True, dtype=dtype,
                          device=device)
            out = model.sample_step(latents.data, timestep.data, labels, coeffs.data,
                                    args.cfg_scale, traced=True, tracer_trace_key=key)
            latents.update(out, traced=True)
            device.synchronize()
            elapsed = (time.perf_counter() - t0) * 1e3
            if i == 0:
                capture_ms = elapsed
            else:
                traced_ms.append(elapsed)
        traced_final = latents.data.numpy()
        traced_median = float(np.median(traced_ms)) if traced_ms else capture_ms
        print(f"  traced  median {traced_median:.2f} ms/step "
              f"(first step, with capture: {capture_ms:.1f} ms)")
        tracer = next(t for t in DiT.sample_step.tracers() if t.trace_captured
                      and t.inputs[0].shape == (1, config.in_channels, size, size))
        info = tracer.trace_info()[0]
        print(f"  trace {info['id']}: {info['commands']} commands, "
              f"{info['bytes'] / 2**20:.1f} MiB of private trace memory, "
              f"{info['external_buffers']} outside buffers")
        identical = (traced_final.shape == eager_final.shape
                     and traced_final.tobytes() == eager_final.tobytes())
        print(f"  final latents ({traced_final.size} values): traced "
              f"{'== eager bit for bit' if identical else '!= eager -- MISMATCH'}")
        if vae is not None:
            # The decode, eager and then traced under the resolution's key (capture, replay),
            # each timed on its second call (the first eager one also maps fresh device memory
            # and makes the GEMM libraries' kernels, as the capture does).
            t0 = time.perf_counter()
            vae.decode(latents.data)
            device.synchronize()
            first_eager = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            eager_out = vae.decode(latents.data)
            device.synchronize()
            decode_eager = (time.perf_counter() - t0) * 1e3
            eager_image = eager_out.numpy()
            t0 = time.perf_counter()
            decode(latents.data, device, traced=True, tracer_trace_key=key)
            device.synchronize()
            decode_capture = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            image = decode(latents.data, device, traced=True, tracer_trace_key=key)
            device.synchronize()
            decode_traced = (time.perf_counter() - t0) * 1e3
            same = image.numpy().tobytes() == eager_image.tobytes()
            identical = identical and same
            print(f"  decode  eager {decode_eager:.1f} ms, traced {decode_traced:.1f} ms (first "
                  f"calls: eager {first_eager:.1f} ms, traced with capture "
                  f"{decode_capture:.1f} ms); image {list(image.shape)}, "
                  f"traced {'== eager bit for bit' if same else '!= eager -- MISMATCH'}")
            if size == sizes[0]:
                rgb = retrace.models.vae_image(image, 0)
                retrace.models.write_png(args.out, rgb)
                print(f"  wrote {args.out} ({rgb.shape[1]}x{rgb.shape[0]} image decoded by the VAE)")
        results.append((key, float(np.median(eager_ms)), traced_median, identical))

    print("summary:")
    for key, eager, traced, identical in results:
        print(f"  {key:>7} latents: eager {eager:8.2f} ms/step, traced {traced:8.2f} ms/step, "
              f"speedup {eager / traced:.2f}x, {'identical' if identical else 'DIFFERENT'}")
    live = sum(t.trace_captured for t in DiT.sample_step.tracers())
    decoder_traces = sum(t.trace_captured for t in decode.tracers())
    print(f"  live traces: {live} (one per resolution)"
          + (f", and {decoder_traces} of the decoder" if vae is not None else ""))
    if not all(r[3] for r in results):
        print("retrace demo: traced and eager results differ; this is a bug", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
