"""The committed config registry: the best Helion config per GPU kind, kernel and shape.

Layout: ``configs/<gpu>/<kernel>.json``, where ``<gpu>`` is :func:`gpu_key` (device name
and compute capability, e.g. ``nvidia_h200_sm90``). A file holds one entry per
(M, K, N, dtype) for the GEMM-shaped kernels, or per (H, D, dtype) for the jagged attention
kernels (:class:`~.kernels.spec.AttentionShape`): the Helion config
(``helion.Config.to_json`` form) and what it was measured at (latency, relative error,
versions, date, tuning settings).

Guarantees:

* Writes are atomic (temporary file in the same folder, fsync, ``os.replace``) and
  serialised by a lock file, so a crash or a second writer never loses finished entries.
* A corrupt or half-written file raises :class:`RegistryError` naming the file, and is
  never overwritten: fix or remove it by hand; nothing else is lost.

Lookup rule for a shape that was not tuned (:func:`nearest_entry`): among the entries of
the same dtype (else of a dtype with the same element size, e.g. fp16 for bf16; never one
of another size, whose tiles would need other amounts of shared memory), take the one with
the smallest
``|log2(M/M')| + |log2(K/K')| + |log2(N/N')|`` (likewise over H and D); ties go to the
larger tuned shape. The
caller gets a :class:`ConfigFallbackWarning`. With no such entry for the GPU, the kernel's
conservative default config is used, also with a warning. Nothing ever starts an
autotuning run inside a user's call.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
import warnings
from pathlib import Path

import filelock
import helion
import torch

from .kernels.spec import AttentionShape, Shape

KEY_TYPES = (Shape, AttentionShape)

FORMAT_VERSION = 1
ENV_CONFIG_DIR = "HELION_KERNELS_CONFIG_DIR"


class RegistryError(RuntimeError):
    """A registry file cannot be read (corrupt, half-written or of another format)."""


class ConfigFallbackWarning(UserWarning):
    """A call runs with a config tuned for another shape, or with the default config."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tuned config: the shape and dtype it was tuned at, and what it measured."""

    shape: Shape | AttentionShape
    dtype: str
    config: helion.Config
    meta: dict = dataclasses.field(default_factory=dict, compare=False)

    @property
    def key(self) -> tuple:
        """(M, K, N, dtype) or (H, D, dtype)."""
        return (*self.shape, self.dtype)

    def to_json(self) -> dict:
        return {
            **self.shape._asdict(),
            "dtype": self.dtype,
            "config": json.loads(self.config.to_json()),
            **self.meta,
        }

    @classmethod
    def from_json(cls, obj: dict) -> "Entry":
        key_type = next((t for t in KEY_TYPES if all(f in obj for f in t._fields)), None)
        if key_type is None:
            raise ValueError(f"entry without a key: expected M, K, N or H, D, got {sorted(obj)}")
        meta = {k: v for k, v in obj.items() if k not in (*key_type._fields, "dtype", "config")}
        shape = key_type(*(int(obj[f]) for f in key_type._fields))
        if min(shape) <= 0:
            raise ValueError(f"entry {shape}: {', '.join(key_type._fields)} must be positive")
        return cls(
            shape=shape,
            dtype=str(obj["dtype"]),
            config=helion.Config.from_json(json.dumps(obj["config"])),
            meta=meta,
        )


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The config a call will run with, and where it came from."""

    config: helion.Config
    source: str  # "exact", "nearest" or "default"
    entry: Entry | None


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def gpu_key(device: torch.device | str | int | None = None) -> str:
    """Registry folder name of a device: ``nvidia_h200_sm90``; ``cpu`` for the CPU."""
    device = torch.device("cuda" if device is None else device)
    if device.type != "cuda":
        return device.type
    name = torch.cuda.get_device_name(device)
    major, minor = torch.cuda.get_device_capability(device)
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return f"{slug}_sm{major}{minor}"


def config_dir() -> Path:
    """``$HELION_KERNELS_CONFIG_DIR``, else the repository's ``configs/`` folder."""
    env = os.environ.get(ENV_CONFIG_DIR)
    return Path(env) if env else Path(__file__).resolve().parent.parent / "configs"


def registry_path(kernel: str, gpu: str) -> Path:
    return config_dir() / gpu / f"{kernel}.json"


def known_gpus() -> list[str]:
    """GPU keys that have at least one registry file."""
    root = config_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.json")))


def load_entries(path: Path) -> dict[tuple, Entry]:
    """All entries of one registry file, keyed by :attr:`Entry.key`; {} if it does not exist.

    Raises:
        RegistryError: the file exists but is not a complete registry file.
    """
    return _load(path)[1]


def _load(path: Path) -> tuple[dict, dict[tuple, Entry]]:
    """The parsed file (``{}`` if absent) and its entries; RegistryError if corrupt."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, {}
    try:
        doc = json.loads(raw.decode("utf-8"))
        if doc.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT_VERSION}")
        entries = [Entry.from_json(obj) for obj in doc["entries"]]
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # UnicodeDecodeError too
        raise RegistryError(
            f"registry file {path} is corrupt or incomplete ({type(err).__name__}: {err}). "
            "It was left untouched; fix or remove it (for a committed registry, "
            "`git checkout` restores the committed version)."
        ) from err
    return doc, {e.key: e for e in entries}


# In-process cache of parsed files, invalidated by modification time and size.
_CACHE: dict[Path, tuple[tuple[int, int], dict[tuple, Entry]]] = {}


def entries_for(kernel: str, gpu: str) -> dict[tuple, Entry]:
    """Cached :func:`load_entries` of ``registry_path(kernel, gpu)``."""
    path = registry_path(kernel, gpu)
    try:
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        return {}
    hit = _CACHE.get(path)
    if hit is None or hit[0] != stamp:
        hit = (stamp, load_entries(path))
        _CACHE[path] = hit
    return hit[1]


def save_entry(kernel: str, gpu: str, entry: Entry, gpu_name: str | None = None) -> Path:
    """Insert or replace one entry, atomically, keeping every other entry of the file.

    Raises:
        RegistryError: the existing file is corrupt; nothing is written.
    """

    def insert(entries: dict[tuple, Entry]) -> None:
        entries[entry.key] = entry

    return _update(kernel, gpu, insert, gpu_name)


def remove_entry(kernel: str, gpu: str, key: tuple) -> Path:
    """Drop the entry of ``key`` (:attr:`Entry.key`), e.g. a config found to give wrong results.

    Raises:
        KeyError: no such entry.
        RegistryError: the existing file is corrupt; nothing is written.
    """

    def drop(entries: dict[tuple, Entry]) -> None:
        del entries[key]

    return _update(kernel, gpu, drop, None)


def _update(kernel: str, gpu: str, change, gpu_name: str | None) -> Path:
    """Read, change and atomically rewrite one registry file under its lock."""
    path = registry_path(kernel, gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(path) + ".lock"):
        old_doc, entries = _load(path)
        gpu_name = gpu_name or old_doc.get("gpu")
        change(entries)
        doc = {
            "format": FORMAT_VERSION,
            "kernel": kernel,
            "gpu": gpu_name or gpu,
            "entries": [
                entries[k].to_json()
                for k in sorted(entries, key=lambda k: (k[-1], *k[:-1]))
            ],
        }
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path


def shape_distance(a: Shape | AttentionShape, b: Shape | AttentionShape) -> float:
    """Sum of |log2| ratios of M, K and N (or of H and D)."""
    return sum(abs(math.log2(x / y)) for x, y in zip(a, b))


def _element_size(dtype: str) -> int | None:
    """Bytes per element of a registry dtype name (None for a name torch does not know)."""
    dt = getattr(torch, dtype, None)
    return dt.itemsize if isinstance(dt, torch.dtype) else None


def nearest_entry(entries: dict[tuple, Entry], shape: Shape | AttentionShape, dtype: str) -> Entry | None:
    """The entry closest to ``shape`` by the rule in this module's docstring."""
    size = _element_size(dtype)
    pool = [e for e in entries.values()
            if type(e.shape) is type(shape) and e.dtype == dtype] or [
        e for e in entries.values() if type(e.shape) is type(shape) and _element_size(e.dtype) == size]
    if not pool:
        return None
    return min(pool, key=lambda e: (shape_distance(e.shape, shape), tuple(-x for x in e.shape)))


def tune_command(kernel: str, shape: Shape | AttentionShape, dtype: str) -> str:
    """The CLI command that tunes ``kernel`` at ``shape`` (attention kernels tune workload
    rows, which carry the sequence lengths the config is timed on)."""
    if isinstance(shape, AttentionShape):
        return (f"helion-kernels autotune --kernel {kernel} --workload {kernel} "
                f"--where 'H == {shape.H} and D == {shape.D}' --dtype {dtype}")
    return f"helion-kernels autotune --kernel {kernel} --shape {shape.M},{shape.K},{shape.N} --dtype {dtype}"


def resolve(
    kernel: str, default: helion.Config, shape: Shape | AttentionShape, dtype: torch.dtype, gpu: str
) -> Resolved:
    """The config a call of ``kernel`` at ``shape``/``dtype`` on ``gpu`` runs with.

    Warns with :class:`ConfigFallbackWarning` unless the exact shape was tuned.
    """
    name = dtype_name(dtype)
    entries = entries_for(kernel, gpu)
    exact = entries.get((*shape, name))
    if exact is not None:
        return Resolved(exact.config, "exact", exact)
    near = nearest_entry(entries, shape, name)
    if near is not None:
        warnings.warn(
            f"{kernel}: no config tuned for {shape} {name} on {gpu}; using the one tuned "
            f"for {near.shape} {near.dtype}. Tune this shape with: {tune_command(kernel, shape, name)}",
            ConfigFallbackWarning,
            stacklevel=3,
        )
        return Resolved(near.config, "nearest", near)
    what = (f"no config for {name} or a dtype of its size" if entries
            else "no config")
    warnings.warn(
        f"{kernel}: the registry has {what} for {gpu} ({registry_path(kernel, gpu)}); "
        f"using the conservative default config, which can be several times slower. Tune "
        f"with: {tune_command(kernel, shape, name)}",
        ConfigFallbackWarning,
        stacklevel=3,
    )
    return Resolved(default, "default", None)
