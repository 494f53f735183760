"""Preprocessing time per A4 300 dpi JPEG page (2480x3508) to the engine's input, on one core.

Measures what a pool process does with a page, ``workers.preprocess.prepare_page`` (header check,
decode with EXIF orientation, resize or pad, encode, and the grey preview the annotated image is
drawn on), on noisy greyscale A4 scans, for the default engine's input (RapidOCR: grey pixels, long
side <= 2000) and for HunyuanOCR's (JPEG bytes, 512^2..2048^2 pixels, sides multiples of 32). Side
by side in the same run it times the straightforward way the seed deployment did it (full colour
decode, area resize, encode), so the ratio holds on a noisy machine, and the floor: entropy-decoding
the JPEG alone (a 1/8 DCT-domain decode, which skips nearly all the rest). OpenCV is limited to one
thread.

Last line: ``preprocess_ms_per_page=<default engine, median ms>``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import cv2
import numpy as np
from common import HUNYUAN_SPEC, a4_scan

from paperlane.models.engine import InputSpec
from paperlane.models.rapid import RapidEngine
from paperlane.settings import WorkerSettings
from paperlane.workers.fit import target_size
from paperlane.workers.preprocess import prepare_page

PREVIEW_SIDE = WorkerSettings().annotated_max_side


def ours(data: bytes, spec: InputSpec) -> object:
    """What a pool process does with a page."""
    return prepare_page(data, spec, preview_side=PREVIEW_SIDE)


def floor(data: bytes, spec: InputSpec) -> object:
    """Entropy decoding alone: a 1/8 DCT-domain decode does little else."""
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_REDUCED_GRAYSCALE_8)


def naive(data: bytes, spec: InputSpec) -> object:
    """The seed's way: decode everything in colour, area-resize, encode."""
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    h, w = img.shape[:2]
    img = cv2.resize(img, target_size(w, h, spec), interpolation=cv2.INTER_AREA)
    if spec.encoding == "jpeg":
        return cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, spec.jpeg_quality])[1]
    return img


def timed(fn, pages: list[bytes], spec: InputSpec, rounds: int) -> float:
    """Median milliseconds per page over ``rounds`` passes."""
    fn(pages[0], spec)
    samples = []
    for _ in range(rounds):
        for page in pages:
            t0 = time.perf_counter()
            fn(page, spec)
            samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=6, help="distinct A4 scans")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    cv2.setNumThreads(1)
    pages = [a4_scan(i) for i in range(args.pages)]
    print(f"{args.pages} A4 scans, 2480x3508, {statistics.mean(map(len, pages)) / 1e6:.2f} MB each, one core")
    rows = {"rapidocr (default)": RapidEngine().input_spec, "hunyuanocr-1.0": HUNYUAN_SPEC}
    result = {}
    for name, spec in rows.items():
        ms = timed(ours, pages, spec, args.rounds)
        seed = timed(naive, pages, spec, args.rounds)
        out = prepare_page(pages[0], spec, preview_side=PREVIEW_SIDE).image
        result[name] = ms
        print(f"{name:>20}: {ms:6.1f} ms/page -> {out.width}x{out.height} {spec.encoding}"
              f"{' grey' if spec.grayscale else ''};  straightforward: {seed:6.1f} ms  ({seed / ms:.1f}x)")
    print(f"{'floor':>20}: {timed(floor, pages, HUNYUAN_SPEC, args.rounds):6.1f} ms/page: entropy decoding alone")
    print(f"preprocess_ms_per_page={result['rapidocr (default)']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
