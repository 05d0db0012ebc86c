"""The DiT step of `retrace bench` in ONNX Runtime and in torch.compile, with retrace's weights.

`make bench` runs it after `retrace bench --json build/bench.json` and
`retrace bench --export-steps build/peers` (one safetensors file per size: the weights, the
step's inputs and retrace's result of the step). For each size and thread count it

- builds the step (patch embedding, timestep and class embeddings, the adaLN-Zero blocks, the
  final layer, unpatchify, then x_next = a * x + b * eps) as an ONNX graph (opset 20) and runs
  it in ONNX Runtime (all graph optimisations, intra-op threads = the thread count, one
  inter-op thread);
- builds it as a torch module and compiles it with torch.compile (inductor, frozen weights,
  under inference_mode; torch.set_num_threads);
- checks each peer's result against retrace's (relative error <= 1e-4 of the largest value, or
  the peer's row says it disagrees) and times it: the median of ROUNDS x STEPS steps after a
  warm-up, like `retrace bench`.

A bfloat16 row of `retrace bench` (`"dtype": "bfloat16"`) gets bfloat16 peers instead:
torch.compile and PyTorch eager with the weights and inputs rounded to bfloat16, and ONNX
Runtime where its CPU provider runs bfloat16 (this script probes a bfloat16 MatMul; where it
cannot, the row says so). Their results are checked against retrace's float32 step within
BFLOAT16_TOLERANCE, the bound `retrace bench` holds its own bfloat16 step to.

It writes the peers' medians and the ratios of retrace's traced step to each peer and to the
best peer into the rows of build/bench.json (`onnxruntime_ms`, `torch_compile_ms`,
`best_peer_ms`, `traced_over_best_peer`, ...), prints the table and draws
bench_peers.png beside that file (--plot to choose another). A peer that cannot run here is skipped with a line saying why.

With `--load N` (default: the load `retrace bench --load N` measured under, read from its
rows) every peer is also timed beside N busy processes spinning on this process' CPUs, rounds
alternating with the unloaded ones as `retrace bench` does, and `<peer>_loaded_ms` and
`<peer>_loaded_over_unloaded` are added.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

FREQUENCY_SIZE = 256


# --- the exported step ---------------------------------------------------------------------------

def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file (F32 and I32, the types retrace bench writes)."""
    types = {"F32": np.float32, "I32": np.int32, "F16": np.float16, "U8": np.uint8}
    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = types[entry["dtype"]]
        out[name] = np.frombuffer(data[base + begin:base + end], dtype=dtype).reshape(entry["shape"]).copy()
    return out


class Step:
    """One size's exported step: the weights, the configuration read off their shapes, inputs."""

    def __init__(self, size: str, path: Path):
        t = read_safetensors(path)
        self.size = size
        self.weights = {k: v for k, v in t.items() if not k.startswith("step.")}
        self.x = t["step.x"]
        self.t_frequencies = t["step.t_frequencies"]
        self.label = int(t["step.label"][0])
        self.a, self.b = (float(v) for v in t["step.coefficients"])
        self.heads = int(t["step.heads"][0])
        self.want = t["step.x_next"]
        w = self.weights
        self.hidden = w["pos_embed"].shape[2]
        self.tokens = w["pos_embed"].shape[1]
        self.patch = w["x_embedder.proj.weight"].shape[2]
        self.in_channels = w["x_embedder.proj.weight"].shape[1]
        self.input_size = self.x.shape[2]
        self.grid = self.input_size // self.patch
        self.out_channels = w["final_layer.linear.weight"].shape[0] // (self.patch * self.patch)
        self.depth = sum(1 for k in w if k.endswith(".attn.qkv.weight"))

    def relative_error(self, got: np.ndarray) -> float:
        got = np.asarray(got, dtype=np.float64).reshape(self.want.shape)
        scale = max(float(np.max(np.abs(self.want))), 1e-30)
        return float(np.max(np.abs(got - self.want))) / scale


# --- ONNX Runtime ------------------------------------------------------------------------------

def onnx_model(s: Step):
    """The step as an ONNX graph; the weights are initializers, the inputs x and t."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    counter = [0]

    def name(prefix: str) -> str:
        counter[0] += 1
        return f"{prefix}_{counter[0]}"

    def const(value, dtype=np.float32) -> str:
        n = name("const")
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), n))
        return n

    def op(kind: str, inputs, n_out: int = 1, **attrs):
        outs = [name(kind.lower()) for _ in range(n_out)]
        nodes.append(helper.make_node(kind, list(inputs), outs, **attrs))
        return outs[0] if n_out == 1 else outs

    added = set()

    def weight(k: str) -> str:  # a weight as an initializer, on first use
        if k not in added:
            inits.append(numpy_helper.from_array(s.weights[k].astype(np.float32), k))
            added.add(k)
        return k

    # The class embedding of this step's label is a constant row of the table.
    class_row = const(s.weights["y_embedder.embedding_table.weight"][s.label][None, :])
    wt = {}

    def linear(x: str, prefix: str) -> str:
        if prefix not in wt:  # W^T once, as an initializer
            wt[prefix] = const(s.weights[prefix + ".weight"].T.copy())
        return op("Add", [op("MatMul", [x, wt[prefix]]), weight(prefix + ".bias")])

    def silu(x: str) -> str:
        return op("Mul", [x, op("Sigmoid", [x])])

    ones_h = const(np.ones(s.hidden))
    zeros_h = const(np.zeros(s.hidden))

    def layer_norm(x: str) -> str:
        return op("LayerNormalization", [x, ones_h, zeros_h], axis=-1, epsilon=1e-6)

    one = const(1.0)

    def modulate(x: str, shift: str, scale: str) -> str:
        return op("Add", [op("Mul", [x, op("Add", [scale, one])]), shift])

    def chunks(x: str, n: int):
        return op("Split", [x], n_out=n, axis=-1, num_outputs=n)

    h, heads, tokens = s.hidden, s.heads, s.tokens
    d = h // heads
    y = op("Conv", ["x", weight("x_embedder.proj.weight"), weight("x_embedder.proj.bias")],
           kernel_shape=[s.patch, s.patch], strides=[s.patch, s.patch])
    y = op("Transpose", [op("Reshape", [y, const([1, h, tokens], np.int64)])], perm=[0, 2, 1])
    y = op("Add", [y, weight("pos_embed")])
    temb = linear(silu(linear("t", "t_embedder.mlp.0")), "t_embedder.mlp.2")
    cond = op("Unsqueeze", [silu(op("Add", [temb, class_row])), const([1], np.int64)])
    qkv_shape = const([1, tokens, 3, heads, d], np.int64)
    merged = const([1, tokens, h], np.int64)
    inv_sqrt_d = const(1.0 / math.sqrt(d))
    for b in range(s.depth):
        p = f"blocks.{b}."
        mod = chunks(linear(cond, p + "adaLN_modulation.1"), 6)
        z = modulate(layer_norm(y), mod[0], mod[1])
        qkv = op("Transpose", [op("Reshape", [linear(z, p + "attn.qkv"), qkv_shape])],
                 perm=[2, 0, 3, 1, 4])
        q, k, v = (op("Squeeze", [part, const([0], np.int64)])
                   for part in op("Split", [qkv], n_out=3, axis=0, num_outputs=3))
        scores = op("Mul", [op("MatMul", [q, op("Transpose", [k], perm=[0, 1, 3, 2])]), inv_sqrt_d])
        attn = op("MatMul", [op("Softmax", [scores], axis=-1), v])
        attn = op("Reshape", [op("Transpose", [attn], perm=[0, 2, 1, 3]), merged])
        y = op("Add", [y, op("Mul", [mod[2], linear(attn, p + "attn.proj")])])
        z = modulate(layer_norm(y), mod[3], mod[4])
        z = linear(op("Gelu", [linear(z, p + "mlp.fc1")], approximate="tanh"), p + "mlp.fc2")
        y = op("Add", [y, op("Mul", [mod[5], z])])
    mod = chunks(linear(cond, "final_layer.adaLN_modulation.1"), 2)
    y = linear(modulate(layer_norm(y), mod[0], mod[1]), "final_layer.linear")
    g, pt, co = s.grid, s.patch, s.out_channels
    y = op("Reshape", [y, const([1, g, g, pt, pt, co], np.int64)])
    y = op("Transpose", [y], perm=[0, 5, 1, 3, 2, 4])
    y = op("Reshape", [y, const([1, co, s.input_size, s.input_size], np.int64)])
    eps = op("Slice", [y, const([0], np.int64), const([s.in_channels], np.int64),
                       const([1], np.int64)])
    nodes.append(helper.make_node(
        "Add", [op("Mul", ["x", const(s.a)]), op("Mul", [eps, const(s.b)])], ["x_next"]))
    x_shape = list(s.x.shape)
    graph = helper.make_graph(
        nodes, f"dit_step_{s.size}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, FREQUENCY_SIZE])],
        [helper.make_tensor_value_info("x_next", TensorProto.FLOAT, x_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


# A bfloat16 cell's agreement with the float32 step (as `retrace bench` checks its own).
BFLOAT16_TOLERANCE = 5e-2


def onnxruntime_bfloat16_probe() -> None:
    """Raises, saying why, when ONNX Runtime's CPU provider cannot run a bfloat16 MatMul."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    io = [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [2, 2]) for n in "abc"]
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "probe", io[:2],
                              io[2:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - the reason is the message
        raise RuntimeError("ONNX Runtime's CPU provider has no bfloat16 MatMul kernel, so it "
                           f"cannot run the step in bfloat16 ({e})") from None
    raise RuntimeError("ONNX Runtime runs a bfloat16 MatMul here, but this script builds its "
                       "step graph in float32 only")


def onnxruntime_runner(s: Step, threads: int, dtype: str = "float32"):
    import onnxruntime as ort

    if dtype != "float32":
        onnxruntime_bfloat16_probe()

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    session = ort.InferenceSession(onnx_model(s).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {"x": s.x, "t": s.t_frequencies}
    return lambda: session.run(None, feeds)[0]


# --- torch.compile -----------------------------------------------------------------------------

def torch_module(s: Step, threads: int, dtype: str):
    """The step as a torch module, its weights in `dtype` (rounded once from float32), and its
    inputs."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    kind = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    w = {k: torch.from_numpy(v.astype(np.float32)).to(kind) for k, v in s.weights.items()}
    h, heads, tokens, d = s.hidden, s.heads, s.tokens, s.hidden // s.heads

    class DiTStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for k, v in w.items():
                self.register_buffer(k.replace(".", "__"), v)

        def p(self, k):
            return getattr(self, k.replace(".", "__"))

        def linear(self, x, prefix):
            return F.linear(x, self.p(prefix + ".weight"), self.p(prefix + ".bias"))

        def forward(self, x, t):
            y = F.conv2d(x, self.p("x_embedder.proj.weight"), self.p("x_embedder.proj.bias"),
                         stride=s.patch)
            y = y.flatten(2).transpose(1, 2) + self.p("pos_embed")
            temb = self.linear(F.silu(self.linear(t, "t_embedder.mlp.0")), "t_embedder.mlp.2")
            table = self.p("y_embedder.embedding_table.weight")
            cond = F.silu(temb + table[s.label:s.label + 1]).unsqueeze(1)
            for b in range(s.depth):
                q = f"blocks.{b}."
                mod = self.linear(cond, q + "adaLN_modulation.1").chunk(6, -1)
                z = F.layer_norm(y, (h,), eps=1e-6) * (mod[1] + 1) + mod[0]
                qkv = self.linear(z, q + "attn.qkv").reshape(1, tokens, 3, heads, d)
                qkv = qkv.permute(2, 0, 3, 1, 4)
                scores = qkv[0] @ qkv[1].transpose(-2, -1) / math.sqrt(d)
                attn = (torch.softmax(scores, -1) @ qkv[2]).permute(0, 2, 1, 3).reshape(1, tokens, h)
                y = y + mod[2] * self.linear(attn, q + "attn.proj")
                z = F.layer_norm(y, (h,), eps=1e-6) * (mod[4] + 1) + mod[3]
                z = self.linear(F.gelu(self.linear(z, q + "mlp.fc1"), approximate="tanh"),
                                q + "mlp.fc2")
                y = y + mod[5] * z
            mod = self.linear(cond, "final_layer.adaLN_modulation.1").chunk(2, -1)
            y = self.linear(F.layer_norm(y, (h,), eps=1e-6) * (mod[1] + 1) + mod[0],
                            "final_layer.linear")
            g, pt, co = s.grid, s.patch, s.out_channels
            y = y.reshape(1, g, g, pt, pt, co).permute(0, 5, 1, 3, 2, 4)
            y = y.reshape(1, co, s.input_size, s.input_size)
            return x * s.a + y[:, :s.in_channels] * s.b

    x = torch.from_numpy(s.x).to(kind)
    t = torch.from_numpy(s.t_frequencies).to(kind)
    return DiTStep().eval(), x, t


def torch_compile_runner(s: Step, threads: int, dtype: str = "float32"):
    import torch
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    model, x, t = torch_module(s, threads, dtype)
    compiled = torch.compile(model, backend="inductor")

    def run():
        with torch.inference_mode():
            return compiled(x, t).float().numpy()
    return run


def torch_eager_runner(s: Step, threads: int, dtype: str = "float32"):
    import torch

    model, x, t = torch_module(s, threads, dtype)

    def run():
        with torch.inference_mode():
            return model(x, t).float().numpy()
    return run


# --- timing and reporting ----------------------------------------------------------------------

# A competitor of --load: spins until killed, and ends by itself after ten minutes.
SPIN = "import signal\nsignal.alarm(600)\nwhile True:\n    pass\n"


@contextlib.contextmanager
def load(processes: int):
    """`processes` busy Python processes on this process' CPUs while the block runs."""
    children = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(processes)]
    try:
        yield
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()


def step_times(run, rounds: int, steps: int, processes: int) -> tuple[list[float], list[float]]:
    """Step times in ms, unloaded and (with processes > 0) beside that many competitors: each
    round runs `steps` unloaded steps, then `steps` loaded ones."""
    for _ in range(3):
        run()  # warm-up (torch.compile compiles here)
    unloaded, loaded = [], []

    def timed(into):
        run()  # untimed: caches hold this peer's data again
        for _ in range(steps):
            start = time.perf_counter()
            run()
            into.append((time.perf_counter() - start) * 1e3)

    for _ in range(rounds):
        timed(unloaded)
        if processes > 0:
            with load(processes):
                timed(loaded)
    return unloaded, loaded


PEERS = {"onnxruntime": onnxruntime_runner, "torch_compile": torch_compile_runner,
         "torch_eager": torch_eager_runner}


def versions() -> dict[str, str]:
    out = {}
    for module in ("onnxruntime", "torch"):
        try:
            out[module] = __import__(module).__version__
        except Exception as e:  # noqa: BLE001 - reported, not raised
            out[module] = f"unavailable ({e.__class__.__name__}: {e})"
    return out


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("peers: chart skipped (matplotlib is not installed)")
        return
    short = {"float32": "f32", "bfloat16": "bf16"}
    cases = [f"{r['size']}/{short.get(r.get('dtype', 'float32'), r.get('dtype'))}/{r['threads']}t"
             for r in rows]
    series = [("retrace traced", "traced_ms"), ("retrace floor", "floor_ms"),
              ("ONNX Runtime", "onnxruntime_ms"), ("torch.compile", "torch_compile_ms")]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.2
    largest = 1.0
    for i, (label, key) in enumerate(series):
        ratios = [(r.get(key) or float("nan")) / r["traced_ms"] for r in rows]
        largest = max([largest] + [x for x in ratios if x == x])
        ax.bar([c + (i - 1.5) * width for c in range(len(rows))], ratios, width, label=label)
    if largest > 10:  # a peer far behind (a dispatch-bound size) would flatten the rest
        ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xticks(range(len(rows)), cases)
    ax.set_ylabel("time / retrace traced (higher: retrace faster)")
    ax.set_title("DiT step, CPU: each mode's median relative to retrace traced (same dtype)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"peers: wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-dir", type=Path, default=Path("build/peers"))
    parser.add_argument("--bench-json", type=Path, default=Path("build/bench.json"),
                        help="retrace bench's rows, to which the peers' columns are added")
    parser.add_argument("--plot", type=Path, default=None,
                        help="the chart (default: bench_peers.png beside --bench-json)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--peers", default="onnxruntime,torch_compile",
                        help="peers of the float32 cells")
    parser.add_argument("--bfloat16-peers", default="onnxruntime,torch_compile,torch_eager",
                        help="peers of the bfloat16 cells (bfloat16 weights and inputs)")
    parser.add_argument("--load", type=int, default=None,
                        help="busy processes to time the peers beside as well (default: the "
                             "bench rows' load, or none)")
    args = parser.parse_args()
    if args.plot is None:
        args.plot = args.bench_json.with_name("bench_peers.png")

    all_rows = json.loads(args.bench_json.read_text())
    if isinstance(all_rows, dict):
        all_rows = all_rows.get("rows", [])
    # The DiT step's rows (the VAE decode's, "model": "vae_decode", are decode_peers.py's).
    rows = [r for r in all_rows if r.get("model", "dit") == "dit"]
    if args.load is None:
        args.load = max((int(r.get("load") or 0) for r in rows), default=0)
    print(f"peers: {json.dumps(versions())}; {os.cpu_count()} CPUs")
    steps: dict[str, Step] = {}
    measured: dict[tuple[str, str, str, int], dict] = {}  # (peer, dtype, size, threads)
    failed = False
    for row in rows:
        size, threads = row["size"], int(row["threads"])
        dtype = row.get("dtype", "float32")
        # float32 peers against retrace's float32 step within 1e-4; bfloat16 ones within
        # BFLOAT16_TOLERANCE of that float32 step, as retrace's bfloat16 step is checked.
        tolerance = 1e-4 if dtype == "float32" else BFLOAT16_TOLERANCE
        peers = args.peers if dtype == "float32" else args.bfloat16_peers
        path = args.steps_dir / f"dit_step_{size}.safetensors"
        if not path.exists():
            print(f"peers: no {path} (run retrace bench --export-steps {args.steps_dir}); "
                  f"size {size} skipped")
            continue
        if size not in steps:
            steps[size] = Step(size, path)
        s = steps[size]
        best = None
        for peer in peers.split(","):
            key = f"{peer}_ms"
            # Peers do not depend on retrace's kernel variant: once per size and thread count.
            if (peer, dtype, size, threads) not in measured:
                columns = {}
                try:
                    run = PEERS[peer](s, threads, dtype)
                    error = s.relative_error(run())
                    columns[f"{peer}_relative_error"] = error
                    columns[f"{peer}_tolerance"] = tolerance
                    unloaded, loaded = step_times(run, args.rounds, args.steps, args.load)
                    columns[key] = statistics.median(unloaded)
                    if loaded:
                        columns[f"{peer}_loaded_ms"] = statistics.median(loaded)
                        columns[f"{peer}_loaded_over_unloaded"] = (
                            columns[f"{peer}_loaded_ms"] / columns[key])
                    if error > tolerance:
                        print(f"peers: {peer} ({dtype}) at {size}/{threads}t differs from "
                              f"retrace's float32 step by a relative {error:.2e} (tolerance "
                              f"{tolerance:.0e})", file=sys.stderr)
                        failed = True
                except Exception as e:  # noqa: BLE001 - a peer that cannot run is skipped
                    columns[key] = None
                    columns[f"{peer}_skipped"] = f"{e.__class__.__name__}: {e}"
                    print(f"peers: {peer} ({dtype}) skipped at {size}/{threads}t: "
                          f"{columns[f'{peer}_skipped']}")
                measured[(peer, dtype, size, threads)] = columns
            row.update(measured[(peer, dtype, size, threads)])
            if row.get(key) is not None:
                best = row[key] if best is None else min(best, row[key])
                row[f"traced_over_{peer}"] = row["traced_ms"] / row[key]
        row["best_peer_ms"] = best
        row["traced_over_best_peer"] = row["traced_ms"] / best if best else None

    print(f"{'size':>4} {'dtype':>8} {'thr':>3} {'isa':>7} {'traced':>9} {'floor':>9} "
          f"{'onnxrt':>9} {'compile':>9} {'torch':>9} {'traced/best peer':>17}  agreement")
    for r in rows:
        def ms(key):
            return f"{r[key]:9.3f}" if r.get(key) is not None else f"{'-':>9}"
        ratio = r.get("traced_over_best_peer")
        agreement = ", ".join(
            f"{peer} {r[peer + '_relative_error']:.1e} (<= {r[peer + '_tolerance']:.0e})"
            for peer in PEERS if r.get(peer + "_relative_error") is not None)
        print(f"{r['size']:>4} {r.get('dtype', 'float32'):>8} {r['threads']:>3} "
              f"{r.get('kernel_isa', ''):>7} {ms('traced_ms')} {ms('floor_ms')} "
              f"{ms('onnxruntime_ms')} {ms('torch_compile_ms')} {ms('torch_eager_ms')} "
              f"{(f'{ratio:.2f}x' if ratio else '-'):>17}  {agreement}")
    if args.load > 0:
        print(f"under load: {args.load} busy process(es); each mode's median step loaded / "
              "unloaded")
        print(f"{'size':>4} {'thr':>3} {'retrace traced':>15} {'onnxrt':>9} {'compile':>9}")
        for r in rows:
            def over(key):
                value = r.get(key)
                return f"{value:.2f}x" if value is not None else "-"
            print(f"{r['size']:>4} {r['threads']:>3} {over('traced_loaded_over_unloaded'):>15} "
                  f"{over('onnxruntime_loaded_over_unloaded'):>9} "
                  f"{over('torch_compile_loaded_over_unloaded'):>9}")
    args.bench_json.write_text(json.dumps(all_rows, indent=2) + "\n")
    print(f"peers: wrote the peers' columns into {args.bench_json}")
    plot(rows, args.plot)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
