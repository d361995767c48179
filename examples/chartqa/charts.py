"""Bar charts as PNG images, drawn without a plotting library, and the questions asked about them.

A chart is a list of bar heights (0-100). :func:`render_png` draws the bars (dark blue, left to right, equal width)
on a white background with a grey axis line, and encodes the image as a PNG with ``zlib`` only, so the example and
its tests need no image package. :func:`make_tasks` writes a seeded set of charts and questions.
"""

from __future__ import annotations

import base64
import random
import struct
import zlib
from pathlib import Path
from typing import Dict, List, Sequence, TypedDict

WIDTH, HEIGHT, MARGIN = 96, 64, 4
BAR_COLOR = (31, 60, 140)
AXIS_COLOR = (128, 128, 128)
BACKGROUND = (255, 255, 255)


class ChartTask(TypedDict):
    id: str
    image: str  # path relative to the tasks file
    question: str
    answer: str


def render_png(heights: Sequence[int], width: int = WIDTH, height: int = HEIGHT) -> bytes:
    """A PNG of the bar chart: bar ``i`` is ``heights[i]`` percent of the plot area high.

    Raises:
        ValueError: No bars, more bars than fit, or a height outside 0-100.
    """
    if not heights or len(heights) > (width - 2 * MARGIN) // 4:
        raise ValueError(f"between 1 and {(width - 2 * MARGIN) // 4} bars fit, got {len(heights)}")
    if any(not 0 <= h <= 100 for h in heights):
        raise ValueError(f"bar heights are percentages (0-100), got {list(heights)}")
    pixels = [[BACKGROUND] * width for _ in range(height)]
    plot_height = height - 2 * MARGIN
    slot = (width - 2 * MARGIN) // len(heights)
    base = height - MARGIN
    for x in range(MARGIN, width - MARGIN):
        pixels[base][x] = AXIS_COLOR
    for index, value in enumerate(heights):
        top = base - round(plot_height * value / 100)
        left = MARGIN + index * slot + slot // 4
        for y in range(top, base):
            for x in range(left, left + max(1, slot // 2)):
                pixels[y][x] = BAR_COLOR
    raw = b"".join(b"\x00" + bytes(channel for pixel in row for channel in pixel) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def data_url(png: bytes) -> str:
    """The image as a ``data:image/png;base64,...`` URL, the form OpenAI-compatible VLM endpoints accept."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


QUESTIONS = {
    "count": "How many bars does the chart have?",
    "tallest": "Counting bars from the left starting at 1, which bar is the tallest?",
}


def answer(kind: str, heights: Sequence[int]) -> str:
    """The gold answer of a question kind for a chart."""
    if kind == "count":
        return str(len(heights))
    return str(max(range(len(heights)), key=lambda i: heights[i]) + 1)


def make_tasks(directory: Path, n: int = 24, seed: int = 0) -> List[ChartTask]:
    """Write ``n`` charts as PNG files under ``directory/images`` and return their tasks (unique tallest bar)."""
    rng = random.Random(seed)
    (directory / "images").mkdir(parents=True, exist_ok=True)
    tasks: List[ChartTask] = []
    for index in range(n):
        bars = rng.randint(2, 7)
        heights = rng.sample(range(10, 100, 5), bars)  # distinct: one tallest bar
        name = f"images/chart-{index:03d}.png"
        (directory / name).write_bytes(render_png(heights))
        kind = "count" if index % 2 == 0 else "tallest"
        tasks.append(
            ChartTask(id=f"chart-{index:03d}", image=name, question=QUESTIONS[kind], answer=answer(kind, heights))
        )
    return tasks


def read_bars(png: bytes) -> List[int]:
    """The bar heights (percent) read back from a PNG written by :func:`render_png` (for checks and tests)."""
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG image")
    position, chunks = 8, {}  # type: ignore[var-annotated]
    data = b""
    while position < len(png):
        (length,) = struct.unpack(">I", png[position : position + 4])
        kind = png[position + 4 : position + 8]
        body = png[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            chunks["size"] = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            data += body
        position += 12 + length
    width, height = chunks["size"]
    raw = zlib.decompress(data)
    stride = 1 + 3 * width
    rows = [raw[y * stride + 1 : (y + 1) * stride] for y in range(height)]
    plot_height = height - 2 * MARGIN
    columns: Dict[int, int] = {}
    for x in range(width):
        column = [tuple(rows[y][3 * x : 3 * x + 3]) for y in range(height)]
        filled = sum(1 for pixel in column if pixel == BAR_COLOR)
        if filled:
            columns[x] = filled
    bars: List[int] = []
    previous = -2
    for x in sorted(columns):
        if x != previous + 1:
            bars.append(round(100 * columns[x] / plot_height))
        previous = x
    return bars
