#!/usr/bin/env python3
"""Checks that the CPU kernel variants stay isolated in a linked program.

Each variant's object must define exactly one global symbol (its entry), and in the program no
global function may contain AVX/AVX-512 instructions (ymm/zmm registers): those exist only in
the variants' local copies, reached through the entry a device chose for its CPU. A global one
would mean the linker could hand baseline code an AVX-512 copy of an inline function.

usage: check_variant_isolation.py OBJDUMP NM PROGRAM VARIANT_OBJECT...
"""
import re
import subprocess
import sys


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def main():
    objdump, nm, program, *objects = sys.argv[1:]
    failures = []
    for obj in objects:
        defined = [line.split()[-1] for line in run(nm, "-g", "--defined-only", obj).splitlines()
                   if line.strip()]
        if len(defined) != 1:
            failures.append(f"{obj}: {len(defined)} global symbols, want 1 (its entry): "
                            f"{defined[:5]}")
    bindings = {}
    for line in run(nm, program).splitlines():
        parts = line.split()
        if len(parts) == 3:
            bindings.setdefault(int(parts[0], 16), set()).add(parts[1])
    header = re.compile(r"^([0-9a-f]+) <(.*)>:$")
    address, name, wide = None, None, set()
    for line in run(objdump, "-d", "--no-show-raw-insn", program).splitlines():
        m = header.match(line)
        if m:
            address, name = int(m.group(1), 16), m.group(2)
            continue
        if address is not None and ("%ymm" in line or "%zmm" in line):
            wide.add((address, name))
    for address, name in sorted(wide):
        kinds = bindings.get(address, set())
        if kinds & {"T", "W", "V"} and not kinds & {"t", "w"}:
            failures.append(f"global function with AVX instructions: {name} at {address:#x}")
    if failures:
        print("\n".join(failures))
        return 1
    print(f"{len(objects)} variant objects export one entry each; {len(wide)} functions with "
          f"AVX instructions in {program}, all local to a variant")
    return 0


if __name__ == "__main__":
    sys.exit(main())
