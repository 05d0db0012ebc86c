#!/usr/bin/env python3
"""Checks a PNG the way an independent reader would: signature, chunk CRCs, IHDR, the zlib
stream (Python's zlib), one filter byte per scanline and the size. Prints "png ok: WxH RGB".

usage: check_png.py FILE WIDTH HEIGHT
"""
import struct
import sys
import zlib


def main() -> int:
    path, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"{path}: not a PNG signature")
    at, chunks = 8, []
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            sys.exit(f"{path}: bad CRC in chunk {kind!r}")
        chunks.append((kind, body))
        at += 12 + length
    kinds = [k for k, _ in chunks]
    if kinds[0] != b"IHDR" or kinds[-1] != b"IEND" or b"IDAT" not in kinds:
        sys.exit(f"{path}: chunks out of order: {kinds}")
    w, h, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if (w, h) != (width, height) or (depth, colour, compression, filtering, interlace) != (8, 2, 0, 0, 0):
        sys.exit(f"{path}: IHDR {w}x{h} depth {depth} colour {colour}; expected {width}x{height} 8-bit RGB")
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    row = 1 + 3 * w
    if len(raw) != row * h:
        sys.exit(f"{path}: {len(raw)} bytes of scanlines, expected {row * h}")
    if any(raw[y * row] > 4 for y in range(h)):
        sys.exit(f"{path}: a scanline has an unknown filter type")
    print(f"png ok: {w}x{h} RGB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
