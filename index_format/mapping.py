"""Index files memory-mapped for random reads: the kernel reads the page a read falls on, not what it would read
ahead of it.

A shard reads rows scattered over its files: a rescoring reads a few hundred vectors of ``embeddings.npy``, a page
of hits a few rows of ``chunks.arrow``. By default a fault on a mapped page that is not in memory reads the 128 KB
around it (Linux's read-ahead of a mapping), 32 pages for a 1.5 KB vector; at ten million chunks, whose files are
larger than the machine's memory, that read more than the queries needed from disk and kept the kernel reclaiming
pages (bench/README.md, "Ten million chunks on one machine").
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np


def map_for_random_reads(path: Path) -> mmap.mmap:
    """The whole file, mapped read-only, its reads declared random (``MADV_RANDOM``)."""
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mapping.madvise(mmap.MADV_RANDOM)
    return mapping


def mapped_npy(path: Path) -> np.ndarray:
    """A ``.npy`` file's array over ``map_for_random_reads``: read-only, its pages read where a row is read (a plain
    ndarray: no ``np.memmap`` Python-level ``__getitem__`` on every read)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    return np.ndarray(shape, dtype, buffer=map_for_random_reads(path), offset=offset, order="F" if fortran else "C")
