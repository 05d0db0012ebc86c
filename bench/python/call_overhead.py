"""Per-call cost of a traced call from Python against the C++ Tracer, measured in one run.

The traced function takes N tensor leaves (a list) and returns them, so its trace holds no
command; the inputs are passed back from tracer.inputs, so nothing is copied. Batches of Python
calls and of C++ Tracer calls (of the same function, in this process) alternate so machine noise
hits both alike. Reports medians in ns per call and the Python overhead against the goal
2000 + 100 N ns.

    python bench/python/call_overhead.py [--json FILE]
"""
import argparse
import json
import statistics
import time

import retrace
from retrace import _core, ops


def measure(leaves: int, rounds: int = 40, batch: int = 256) -> dict:
    device = retrace.open_device("cpu")
    xs = [ops.full([16], float(i), device) for i in range(leaves)]
    tracer = retrace.Tracer(lambda inputs: inputs, device=device, prep_run=False)
    tracer(xs)
    slots = tracer.inputs[0]
    py_ns, cpp_ns = [], []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            tracer(slots)
        py_ns.append((time.perf_counter_ns() - t0) / batch)
        cpp_ns.append(_core._bench_cpp_tracer(device, leaves, batch))
    assert tracer.stats["copies"] == 0, "inputs were copied"
    device.close()
    py, cpp = statistics.median(py_ns), statistics.median(cpp_ns)
    return {"leaves": leaves, "python_ns": py, "cpp_ns": cpp, "overhead_ns": py - cpp,
            "goal_ns": 2000 + 100 * leaves}


def measure_decorator(leaves: int = 8, calls: int = 20000) -> dict:
    """The same function through @traced_function in its three device modes, against the bare
    Tracer (best of 5 batches each, in ns per call)."""
    device = retrace.open_device("cpu")
    xs = [ops.full([16], float(i), device) for i in range(leaves)]

    class Model:
        def __init__(self, device):
            self.device = device

        @retrace.traced_function(device=lambda self: self.device, prep_run=False)
        def step(self, inputs):
            return inputs

    @retrace.traced_function(prep_run=False)
    def with_parameter(inputs, mesh_device):
        return inputs

    @retrace.traced_function(inject_mesh_device=True, prep_run=False)
    def injected(inputs):
        return inputs

    tracer = retrace.Tracer(lambda inputs: inputs, device=device, prep_run=False)
    tracer(xs)
    model = Model(device)
    model.step(xs, traced=True)
    with_parameter(xs, device, traced=True)
    injected(xs, device=device, traced=True)
    slots = [t.inputs[0] for t in (tracer, Model.step.tracers()[0],
                                   with_parameter.tracers()[0], injected.tracers()[0])]
    cases = {
        "Tracer": lambda: tracer(slots[0]),
        "device=": lambda: model.step(slots[1], traced=True),
        "device parameter": lambda: with_parameter(slots[2], device, traced=True),
        "inject_mesh_device": lambda: injected(slots[3], device=device, traced=True),
    }
    out = {}
    for name, call in cases.items():
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                call()
            best = min(best, (time.perf_counter_ns() - t0) / calls)
        out[name] = best
    device.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [measure(n) for n in (1, 8, 64)]
    print(f"{'leaves':>6} {'python ns':>10} {'C++ ns':>8} {'overhead ns':>12} {'goal ns':>8}")
    for r in rows:
        print(f"{r['leaves']:>6} {r['python_ns']:>10.0f} {r['cpp_ns']:>8.0f} "
              f"{r['overhead_ns']:>12.0f} {r['goal_ns']:>8}  "
              f"{'ok' if r['overhead_ns'] <= r['goal_ns'] else 'OVER'}")
    decorator = measure_decorator()
    print("\n@traced_function, 8 leaves (ns per call, best of 5):")
    for name, ns in decorator.items():
        print(f"  {name:<20} {ns:>8.0f}  {ns / decorator['Tracer']:.1f}x the Tracer")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tracer": rows, "traced_function": decorator}, f, indent=2)


if __name__ == "__main__":
    main()
