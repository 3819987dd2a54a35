#!/usr/bin/env python3
"""png_pixels.py PNG — what a screenshot shows, for tests/cli/test_report.sh: prints
"W H DISTINCT NONWHITE BLUE ORANGE", the image size, its distinct colours, and the per mille
of its pixels that are not white, blue (a heatmap cell of a busy expert, a line) and orange
(an idle expert's cell). Reads 8-bit RGB / RGBA PNGs (what Chromium writes) with zlib only."""
import struct
import sys
import zlib

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {2: 3, 6: 4}  # PNG colour type: RGB, RGBA


def chunks(data):
    pos = len(PNG_SIGNATURE)
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        yield data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def unfilter(kind, line, prev, bpp):
    if kind == 0:
        return line
    if kind == 2:  # up: no dependency along the row
        return bytearray((v + b) & 255 for v, b in zip(line, prev))
    for x in range(len(line)):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]
        c = prev[x - bpp] if x >= bpp else 0
        if kind == 1:
            line[x] = (line[x] + a) & 255
        elif kind == 2:
            line[x] = (line[x] + b) & 255
        elif kind == 3:
            line[x] = (line[x] + ((a + b) >> 1)) & 255
        elif kind == 4:
            line[x] = (line[x] + paeth(a, b, c)) & 255
    return line


def pixels(path):
    data = open(path, "rb").read()
    if not data.startswith(PNG_SIGNATURE):
        sys.exit(f"{path}: not a PNG")
    idat = b""
    for kind, body in chunks(data):
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            if depth != 8 or colour not in CHANNELS:
                sys.exit(f"{path}: bit depth {depth}, colour type {colour}: only 8-bit RGB/RGBA is read")
        elif kind == b"IDAT":
            idat += body
    bpp = CHANNELS[colour]
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        start = y * (stride + 1)
        line = unfilter(raw[start], bytearray(raw[start + 1:start + 1 + stride]), prev, bpp)
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
        prev = line
    return width, height, rows


def main():
    width, height, rows = pixels(sys.argv[1])
    colours = {}
    for row in rows:
        for p in row:
            colours[p] = colours.get(p, 0) + 1
    total = width * height
    nonwhite = sum(n for p, n in colours.items() if min(p) < 245)
    blue = sum(n for (r, g, b), n in colours.items() if b > r + 40)
    orange = sum(n for (r, g, b), n in colours.items() if r > b + 60 and g > b)
    print(width, height, len(colours), 1000 * nonwhite // total, 1000 * blue // total, 1000 * orange // total)


main()
