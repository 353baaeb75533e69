"""Message sizes as the benchmark's options write them."""

from __future__ import annotations

import argparse

DEFAULT_SIZES = sorted({2 ** k for k in range(3, 29)} | {12, 3000, 100_000})
QUICK_SIZES = [8, 4096, 65536]
_SUFFIX = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
           "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
  """'4096', '4K', '64KiB', '1M' -> bytes (binary multiples)."""
  t = text.strip().upper()
  i = len(t)
  while i and not t[i - 1].isdigit():
    i -= 1
  number, suffix = t[:i], t[i:]
  if not number.isdigit() or suffix not in _SUFFIX:
    raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 8, 4K, 1M)")
  value = int(number) * _SUFFIX[suffix]
  if value <= 0:
    raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
  return value


def format_size(n: int) -> str:
  for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if n >= scale and n % scale == 0:
      return f"{n // scale} {unit}"
  return f"{n} B"
