"""The VAE decode of `make bench`: retrace's traced decode against diffusers' decoder in PyTorch
eager, torch.compile and ONNX Runtime, on the same weights and latents.

A randomly initialised AutoencoderKL of the Stable Diffusion VAE's size (its config.json:
blocks 128, 256, 512, 512, two layers per block, 32 groups, 83M parameters, seeded) is saved
as diffusers saves it; for each image size (a latent of size / 8) and thread count:

- retrace: `retrace decode` on that file (RETRACE_KERNEL_THREADS), the median of its timed
  replays of the traced decode; with --bench-json, the traced_ms of retrace bench's decode row
  of that size and thread count instead (`retrace bench --decode`: the same architecture with
  retrace's own random weights; `retrace decode` then only makes the image that the peers'
  images are checked against), and the peers' columns go into that row;
- PyTorch eager: `vae.decode(latents / 0.18215)` under inference_mode (torch.set_num_threads);
- torch.compile: the same module compiled (inductor), after a warm-up call;
- ONNX Runtime: the decoder exported by torch.onnx (opset 17), all graph optimisations,
  intra-op threads = the thread count.

Each peer's image is checked against retrace's (largest difference over the largest value
<= 1e-3, or its row says it disagrees) and timed as the median of ROUNDS decodes after a warm-up.
Prints the table (ratios traced / peer), writes JSON. A peer that cannot run here is skipped
with a line saying why.

    .venv-peers/bin/python bench/python/decode_peers.py --retrace build/bin/retrace \\
        --workdir build/decode --json build/bench_decode.json [--sizes 256,512] [--rounds 3] \\
        [--bench-json build/bench.json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

SCALING = 0.18215


def median_ms(fn, rounds: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--retrace", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--json", default=None)
    parser.add_argument("--sizes", default="256", help="image sizes, e.g. 256,512")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bench-json", type=Path, default=None,
                        help="retrace bench's JSON with a decode row (retrace bench --decode): "
                             "retrace's time comes from its traced_ms, and the peers' columns "
                             "are added to it")
    args = parser.parse_args()
    bench_rows = json.loads(args.bench_json.read_text()) if args.bench_json else []
    decode_rows = {(r["image"], int(r["threads"])): r for r in bench_rows
                   if r.get("model") == "vae_decode"}
    try:
        import torch
        from diffusers import AutoencoderKL
    except ImportError as e:
        print(f"decode_peers: skipped: {e} (scripts/peers-env.sh installs torch and diffusers)")
        return 0
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    blocks = (128, 256, 512, 512)  # the Stable Diffusion VAE's architecture (its config.json)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4,
                        block_out_channels=blocks, layers_per_block=2, norm_num_groups=32,
                        down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4).eval()
    with torch.no_grad():
        for p in vae.parameters():
            if p.dim() == 1:
                p.add_(0.05 * torch.randn_like(p))
    vae.save_pretrained(work / "vae", safe_serialization=True)
    weights = work / "vae" / "diffusion_pytorch_model.safetensors"

    class Decoder(torch.nn.Module):
        def __init__(self, vae):
            super().__init__()
            self.vae = vae

        def forward(self, z):
            return self.vae.decode(z / SCALING).sample

    decoder = Decoder(vae).eval()
    rows = []
    print(f"decode_peers: the Stable Diffusion VAE's decoder (random weights), float32, median of "
          f"{args.rounds} decodes after a warm-up; torch {torch.__version__}")
    print(f"{'image':>7} {'threads':>7} {'retrace':>10} {'eager':>10} {'compile':>10} {'ort':>10}"
          f"  traced/eager  traced/compile  traced/ort  traced/best")
    for size in (int(s) for s in args.sizes.split(",")):
        latent = size // 8
        z = np.random.default_rng(size).standard_normal((1, 4, latent, latent)).astype(np.float32)
        np.save(work / f"latents_{size}.npy", z)
        onnx_path = work / f"decoder_{size}.onnx"
        for threads in (int(t) for t in args.threads.split(",")):
            row = {"image": size, "threads": threads}
            env = dict(os.environ, RETRACE_KERNEL_THREADS=str(threads))
            bench_row = decode_rows.get((size, threads))
            run = subprocess.run(
                [args.retrace, "decode", "--vae", str(weights), "--latents",
                 str(work / f"latents_{size}.npy"), "--replays",
                 str(1 if bench_row else args.rounds), "--out",
                 str(work / f"retrace_{size}.png"), "--save-image", str(work / f"retrace_{size}.npy")],
                capture_output=True, text=True, env=env)
            if run.returncode != 0:
                print(run.stdout + run.stderr, file=sys.stderr)
                return 1
            row["retrace_ms"] = float(re.search(r"traced  median ([0-9.]+) ms", run.stdout).group(1))
            if bench_row:  # the bench's own measurement of the same architecture and size
                row["retrace_ms"] = bench_row["traced_ms"]
            want = np.load(work / f"retrace_{size}.npy")
            torch.set_num_threads(threads)
            zt = torch.from_numpy(z)
            with torch.inference_mode():
                image = decoder(zt).numpy()
                row["eager_error"] = relative(image, want)
                row["eager_ms"] = median_ms(lambda: decoder(zt), args.rounds)
                try:
                    compiled = torch.compile(decoder)
                    t0 = time.perf_counter()
                    image = compiled(zt).numpy()
                    row["compile_s"] = time.perf_counter() - t0
                    row["compile_error"] = relative(image, want)
                    row["torch_compile_ms"] = median_ms(lambda: compiled(zt), args.rounds)
                except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported
                    print(f"  torch.compile skipped: {type(e).__name__}: {e}".splitlines()[0])
            try:
                import onnxruntime as ort
                if not onnx_path.exists():
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        torch.onnx.export(decoder, (zt,), str(onnx_path), opset_version=17,
                                          input_names=["z"], output_names=["image"], dynamo=False)
                options = ort.SessionOptions()
                options.intra_op_num_threads = threads
                options.inter_op_num_threads = 1
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                session = ort.InferenceSession(str(onnx_path), options,
                                               providers=["CPUExecutionProvider"])
                image = session.run(None, {"z": z})[0]
                row["ort_error"] = relative(image, want)
                row["onnxruntime_ms"] = median_ms(lambda: session.run(None, {"z": z}),
                                                  args.rounds)
            except Exception as e:  # noqa: BLE001
                print(f"  ONNX Runtime skipped: {type(e).__name__}: {e}".splitlines()[0])
            peers = {k: row[k] for k in ("eager_ms", "torch_compile_ms", "onnxruntime_ms")
                     if k in row and row.get(k.replace("_ms", "_error").replace(
                         "torch_compile", "compile").replace("onnxruntime", "ort"), 0) <= 1e-3}
            row["best_peer_ms"] = min(peers.values()) if peers else None
            rows.append(row)
            if bench_row:
                for key in ("eager_ms", "torch_compile_ms", "onnxruntime_ms"):
                    name = "torch_eager_ms" if key == "eager_ms" else key
                    if key in row:
                        bench_row[name] = row[key]
                        bench_row[f"traced_over_{name[:-3]}"] = bench_row["traced_ms"] / row[key]
                for key in ("eager_error", "compile_error", "ort_error", "compile_s"):
                    if key in row:
                        bench_row[f"peer_{key}"] = row[key]
                bench_row["best_peer_ms"] = row["best_peer_ms"]
                bench_row["traced_over_best_peer"] = (
                    bench_row["traced_ms"] / row["best_peer_ms"] if row["best_peer_ms"] else None)

            def cell(key):
                return f"{row[key]:10.1f}" if key in row else f"{'-':>10}"

            def ratio(key):
                return f"{row['retrace_ms'] / row[key]:.2f}x" if row.get(key) else "-"

            print(f"{size:>7} {threads:>7} {cell('retrace_ms')} {cell('eager_ms')} "
                  f"{cell('torch_compile_ms')} {cell('onnxruntime_ms')}  {ratio('eager_ms'):>12}"
                  f"  {ratio('torch_compile_ms'):>14}  {ratio('onnxruntime_ms'):>10}"
                  f"  {ratio('best_peer_ms'):>11}")
            errors = {k: f"{row[k]:.1e}" for k in ("eager_error", "compile_error", "ort_error")
                      if k in row}
            print(f"{'':>15} agreement with retrace's image (largest difference / largest value): "
                  f"{errors}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.bench_json:
        missing = [f"{r['image']}/{r['threads']}t" for r in rows
                   if (r["image"], r["threads"]) not in decode_rows]
        if missing:
            print(f"decode_peers: {args.bench_json} has no decode row for {missing} (retrace "
                  f"bench --decode); retrace's time there is retrace decode's")
        args.bench_json.write_text(json.dumps(bench_rows, indent=2) + "\n")
        print(f"decode_peers: wrote the peers' columns into the decode rows of {args.bench_json}")
    disagree = [r for r in rows for k in ("eager_error", "compile_error", "ort_error")
                if r.get(k, 0) > 1e-3]
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
