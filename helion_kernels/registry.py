"""The config registry: the best Helion config per GPU kind, kernel and shape.

Two layers, searched user first:

* the **user registry**, ``$HELION_KERNELS_CONFIG_DIR`` (default
  ``~/.cache/helion-kernels/configs``): where ``helion-kernels autotune`` writes. To update
  the registry committed in a checkout, point the variable at its ``configs/`` folder.
* the **shipped registry**, the configs measured by this project, installed with the
  package (``helion_kernels/_configs`` in a wheel; the checkout's ``configs/`` folder when
  run from a source tree). Never written by the package.

Layout of both: ``<root>/<gpu>/<kernel>.json``, where ``<gpu>`` is :func:`gpu_key` (device
name and compute capability, e.g. ``nvidia_h200_sm90``) and ``<kernel>`` the public op's
name. A file holds one entry per (M, K, N, dtype) for the GEMM-shaped kernels, or per
(H, D, dtype) for the jagged attention kernels: the Helion config (as ``helion.Config``'s
JSON dict) and what it was measured at (latency, relative error, versions, date, tuning
settings). An entry of the user registry replaces the shipped entry of the same key.

Guarantees:

* Writes are atomic (temporary file in the same folder, fsync, ``os.replace``) and
  serialised by a lock file, so a crash or a second writer never loses finished entries.
* A corrupt or half-written file raises :class:`RegistryError` naming the file, and is
  never overwritten: fix or remove it by hand; nothing else is lost.

Lookup (:func:`lookup`) for a call at a key, dtype and GPU:

1. **exact**: an entry of the GPU (either layer) at the key and dtype;
2. **nearest**: among the GPU's entries of the same dtype (else of a dtype with the same
   element size, e.g. fp16 for bf16; never one of another size, whose tiles would need
   other amounts of shared memory), the one with the smallest
   ``|log2(M/M')| / 2 + |log2(K/K')| / 4 + |log2(N/N')|`` (:data:`GEMM_DISTANCE_WEIGHTS`;
   over H and D unweighted), ties to the larger shape. A GPU with no entries of its
   own for the kernel uses those of another GPU of the same architecture (``..._sm90``),
   always as *nearest*, so the caller still fits the config to its device;
3. **default**: the kernel's conservative default config.

Cases 2 and 3 warn with :class:`ConfigFallbackWarning`, naming the ``autotune`` command for
the shape. Nothing ever starts an autotuning run inside a user's call. This module imports
neither Helion nor the kernels: configs stay JSON dicts here.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import os
import re
import tempfile
import warnings
from pathlib import Path

import filelock
import torch

from . import liger_norm
from .spec import ATTENTION_WORKLOAD, AttentionShape, Shape

KEY_TYPES = (Shape, AttentionShape)
FORMAT_VERSION = 1
ENV_CONFIG_DIR = "HELION_KERNELS_CONFIG_DIR"
WORKLOAD_FOLDERS = ("workloads", "attention_workloads")
DTYPE_NAMES = ("bfloat16", "float16", "float32")  # the dtypes the ops take and entries are tuned at
# An entry's dispatch decision for training calls (the forward also writes what the backward
# needs), beside its forward ``dispatch`` record; same fields. Written by
# bench/dispatch_from_bench.py --training from bench/postnorm_training_forward.py's table, and
# carried over a re-tune (marked MEASURED_CONFIG) by tuning.carried_training_record.
TRAINING_DISPATCH = "dispatch_training"
# In a training record a re-tune carried over from the entry it replaced: the tuned_at of the
# entry whose config the record timed (see tuning.carried_training_record).
MEASURED_CONFIG = "measured_config_tuned_at"


def _positive_int(value) -> bool:
    return type(value) is int and value > 0


# Config fields this module can check without Helion (Helion checks the rest when it binds the
# config): field -> (check, what the value must be).
_CONFIG_CHECKS = {
    "block_sizes": (lambda v: isinstance(v, list) and all(map(_positive_int, v)), "a list of positive integers"),
    "num_warps": (_positive_int, "a positive integer"),
    "num_stages": (_positive_int, "a positive integer"),
}

_PACKAGE = Path(__file__).resolve().parent


class RegistryError(RuntimeError):
    """A registry file cannot be read (corrupt, half-written or of another format)."""


class ConfigFallbackWarning(UserWarning):
    """A call runs with a config tuned for another shape or GPU, or with the default config."""


def dispatch_text(dispatch: dict) -> str:
    """A registry entry's dispatch record in a word or three: ``fused``, ``unfused``, or
    ``unfused (Liger norm)`` where the unfused path is cuBLAS + Liger's norm (run where
    liger-kernel is installed)."""
    choice = dispatch.get("choice", "unfused")
    return "unfused (Liger norm)" if choice == "unfused" and dispatch.get("unfused") == liger_norm.PIPELINE else choice


def _config_dict(config) -> dict:
    """A config as its JSON dict: a ``helion.Config`` (anything with ``to_json``) or a dict."""
    if hasattr(config, "to_json"):
        return json.loads(config.to_json())
    return dict(config)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tuned config: the key (shape) and dtype it was tuned at, and what it measured.

    ``config`` is the config's JSON dict (a ``helion.Config`` passed in is converted);
    ``helion.Config(**entry.config)`` rebuilds it.
    """

    shape: Shape | AttentionShape
    dtype: str
    config: dict
    meta: dict = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", _config_dict(self.config))

    @property
    def key(self) -> tuple:
        """(M, K, N, dtype) or (H, D, dtype)."""
        return (*self.shape, self.dtype)

    @property
    def tuned_on(self) -> str:
        """The UTC day the entry was tuned, ``YYYY-MM-DD`` (from ``tuned_at``); "" if unrecorded."""
        return str(self.meta.get("tuned_at", ""))[:10]

    def to_json(self) -> dict:
        return {**self.shape._asdict(), "dtype": self.dtype, "config": self.config, **self.meta}

    @classmethod
    def from_json(cls, obj: dict) -> "Entry":
        key_type = next((t for t in KEY_TYPES if all(f in obj for f in t._fields)), None)
        if key_type is None:
            raise ValueError(f"entry without a key: expected M, K, N or H, D, got {sorted(obj)}")
        meta = {k: v for k, v in obj.items() if k not in (*key_type._fields, "dtype", "config")}
        shape = key_type(*(int(obj[f]) for f in key_type._fields))
        if min(shape) <= 0:
            raise ValueError(f"entry {shape}: {', '.join(key_type._fields)} must be positive")
        if not isinstance(obj["config"], dict):
            raise ValueError(f"entry {shape}: config must be a JSON object")
        if obj["dtype"] not in DTYPE_NAMES:
            raise ValueError(f"entry {shape}: dtype {obj['dtype']!r} is not one of {', '.join(DTYPE_NAMES)}")
        for name, (check, what) in _CONFIG_CHECKS.items():
            if name in obj["config"] and not check(obj["config"][name]):
                raise ValueError(f"entry {shape}: config field {name!r} = {obj['config'][name]!r} is not {what}")
        return cls(shape=shape, dtype=str(obj["dtype"]), config=obj["config"], meta=meta)


@dataclasses.dataclass(frozen=True)
class Lookup:
    """Where a call's config comes from: ``source`` is "exact", "nearest" or "default";
    ``entry`` is None for "default"; ``gpu`` is the GPU the entry was tuned on."""

    source: str
    entry: Entry | None
    gpu: str | None = None


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def gpu_key(device: torch.device | str | int | None = None) -> str:
    """Registry folder name of a device: ``nvidia_h200_sm90``; ``cpu`` for the CPU."""
    return _gpu_key(torch.device("cuda" if device is None else device))


@functools.lru_cache(maxsize=None)
def _gpu_key(device: torch.device) -> str:  # asked on every call: the CUDA queries are cached
    if device.type != "cuda":
        return device.type
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    name = torch.cuda.get_device_name(device)
    major, minor = torch.cuda.get_device_capability(device)
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return f"{slug}_sm{major}{minor}"


def _architecture(gpu: str) -> str | None:
    """``nvidia_h200_sm90`` -> ``sm90``; None for a key without one (``cpu``)."""
    match = re.search(r"_(sm\d+)$", gpu)
    return match.group(1) if match else None


def shipped_dir() -> Path:
    """The shipped registry: ``helion_kernels/_configs`` in an installed wheel, else the
    source checkout's ``configs/`` folder (editable installs, ``PYTHONPATH`` runs)."""
    installed = _PACKAGE / "_configs"
    return installed if installed.is_dir() else _PACKAGE.parent / "configs"


def user_dir() -> Path:
    """The user registry: ``$HELION_KERNELS_CONFIG_DIR``, else ``~/.cache/helion-kernels/configs``
    (under ``$XDG_CACHE_HOME`` when set).

    Raises:
        RegistryError: ``$HELION_KERNELS_CONFIG_DIR`` names something that is not a folder.
    """
    env = os.environ.get(ENV_CONFIG_DIR)
    if env:
        env = os.path.expanduser(env)  # a quoted "~/..." reaches us unexpanded
        if Path(env).exists() and not Path(env).is_dir():
            raise RegistryError(f"${ENV_CONFIG_DIR} = {env} is not a folder; point it at a folder "
                                "(it is created on the first save) or unset it")
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "helion-kernels" / "configs"


def _roots() -> list[Path]:
    """Registry roots in search order (the user's first), without repeats."""
    roots: list[Path] = []
    for root in (user_dir(), shipped_dir()):
        if root.resolve() not in [r.resolve() for r in roots]:
            roots.append(root)
    return roots


def registry_path(kernel: str, gpu: str) -> Path:
    """Where :func:`save_entry` writes ``kernel``'s entries for ``gpu`` (the user registry)."""
    return user_dir() / gpu / f"{kernel}.json"


def known_gpus() -> list[str]:
    """GPU keys that have at least one registry file, in either layer."""
    found = {p.name for root in _roots() if root.is_dir() for p in root.iterdir()
             if p.is_dir() and p.name not in WORKLOAD_FOLDERS and any(p.glob("*.json"))}
    return sorted(found)


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
    except OSError as err:  # a folder where the file should be, no permission, ...
        raise RegistryError(f"registry file {path} cannot be read ({type(err).__name__}: {err})") from err
    try:
        doc = json.loads(raw.decode("utf-8"))
        if not isinstance(doc, dict):
            raise TypeError(f"the file holds a JSON {type(doc).__name__}, not a registry object")
        if doc.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT_VERSION}")
        if doc.get("kernel", path.stem) != path.stem:
            raise ValueError(f"the file holds {doc['kernel']!r}'s entries, its name says {path.stem!r}")
        if not isinstance(doc["entries"], list):  # {} would iterate as no entries and pass silently
            raise TypeError(f"'entries' must be a list, got {type(doc['entries']).__name__}")
        entries = [Entry.from_json(obj) for obj in doc["entries"]]
        keys = [e.key for e in entries]
        if len(set(keys)) != len(keys):
            raise ValueError(f"key {next(k for k in keys if keys.count(k) > 1)} appears more than once")
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # UnicodeDecodeError too
        shipped = path.resolve().is_relative_to(shipped_dir().resolve())
        raise RegistryError(
            f"registry file {path} is corrupt or incomplete ({type(err).__name__}: {err}). "
            "It was left untouched; fix or remove it"
            + (" (in a checkout, `git checkout` restores the committed version)." if shipped else
               " (removing it loses the configs tuned into it; `autotune` writes a new one).")
        ) from err
    return doc, {e.key: e for e in entries}


# In-process cache of parsed files, invalidated by modification time and size.
_CACHE: dict[Path, tuple[tuple[int, int], dict[tuple, Entry]]] = {}


def _cached_entries(path: Path) -> dict[tuple, Entry]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _CACHE.get(path)
    if hit is None or hit[0] != stamp:
        hit = (stamp, load_entries(path))
        _CACHE[path] = hit
    return hit[1]


def entries_for(kernel: str, gpu: str) -> dict[tuple, Entry]:
    """The entries of ``kernel`` for ``gpu``, both layers merged (user entries win)."""
    return merge_layers(entries_by_layer(kernel, gpu))


def merge_layers(layers: dict[str, dict[tuple, Entry]]) -> dict[tuple, Entry]:
    """One kernel's entries from :func:`entries_by_layer`, merged: user entries win."""
    return {**layers.get("shipped", {}), **layers["user"]}


def unknown_files(gpu: str, kernels) -> list[Path]:
    """Registry files of ``gpu``, in either layer, whose names are none of ``kernels`` (a typo,
    or an op's former name): no lookup reads them."""
    return sorted(p for root in _roots() for p in (root / gpu).glob("*.json") if p.stem not in kernels)


def entries_by_layer(kernel: str, gpu: str) -> dict[str, dict[tuple, Entry]]:
    """``kernel``'s entries for ``gpu`` in each registry layer, ``{"user": ..., "shipped": ...}``
    (only ``"user"`` when both layers are one folder, e.g. a checkout pointing
    ``$HELION_KERNELS_CONFIG_DIR`` at its own ``configs/``)."""
    return dict(zip(("user", "shipped"), (_cached_entries(root / gpu / f"{kernel}.json") for root in _roots())))


def _same_architecture(kernel: str, gpu: str) -> tuple[str, dict[tuple, Entry]] | None:
    """Another GPU of ``gpu``'s architecture with entries for ``kernel`` (the one with the
    most; ties by name), and those entries; None if there is none."""
    arch = _architecture(gpu)
    if arch is None:
        return None
    candidates = [(g, entries_for(kernel, g)) for g in known_gpus()
                  if g != gpu and _architecture(g) == arch]
    candidates = [(g, e) for g, e in candidates if e]
    if not candidates:
        return None
    return min(candidates, key=lambda ge: (-len(ge[1]), ge[0]))


def save_entry(kernel: str, gpu: str, entry: Entry, gpu_name: str | None = None) -> Path:
    """Insert or replace one entry of the user registry, atomically, keeping every other
    entry of the file.

    Raises:
        RegistryError: the existing file is corrupt; nothing is written.
    """

    def insert(entries: dict[tuple, Entry]) -> None:
        entries[entry.key] = entry

    return _update(kernel, gpu, insert, gpu_name)


def remove_entry(kernel: str, gpu: str, key: tuple) -> Path:
    """Drop the user registry's entry of ``key`` (:attr:`Entry.key`).

    Raises:
        KeyError: no such entry.
        RegistryError: the existing file is corrupt; nothing is written.
    """

    def drop(entries: dict[tuple, Entry]) -> None:
        del entries[key]

    return _update(kernel, gpu, drop, None)


def _update(kernel: str, gpu: str, change, gpu_name: str | None) -> Path:
    """Read, change and atomically rewrite one user registry file under its lock."""
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
            "entries": [entries[k].to_json() for k in sorted(entries, key=lambda k: (k[-1], *k[:-1]))],
        }
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            # mkstemp's file is the owner's only: keep the replaced file's mode, else rw-r--r--
            os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
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


# Weights of |log2| ratios of (M, K, N) in the nearest-shape distance: N mattered most to what a
# config lost at another shape at M = 65536 (bench/NOTES.md, config transfer); an attention
# key's (H, D) weigh alike.
GEMM_DISTANCE_WEIGHTS = Shape(M=0.5, K=0.25, N=1.0)


def shape_distance(a: Shape | AttentionShape, b: Shape | AttentionShape, weights: tuple | None = None) -> float:
    """Weighted sum of |log2| ratios of M, K and N (``weights``, default
    :data:`GEMM_DISTANCE_WEIGHTS`), or the plain sum over H and D."""
    if weights is None:
        weights = GEMM_DISTANCE_WEIGHTS if isinstance(a, Shape) else (1.0,) * len(a)
    return sum(w * abs(math.log2(x / y)) for w, x, y in zip(weights, a, b))


def _element_size(dtype: str) -> int | None:
    """Bytes per element of a registry dtype name (None for a name torch does not know)."""
    dt = getattr(torch, dtype, None)
    return dt.itemsize if isinstance(dt, torch.dtype) else None


def _by_distance(entries: dict[tuple, Entry], shape: Shape | AttentionShape, dtype: str) -> list[Entry]:
    """The entries of ``shape``'s kind and ``dtype`` (else of a dtype of its size), nearest
    first by :func:`shape_distance`, the larger shape first at equal distance."""
    size = _element_size(dtype)
    pool = [e for e in entries.values()
            if type(e.shape) is type(shape) and e.dtype == dtype] or [
        e for e in entries.values() if type(e.shape) is type(shape) and _element_size(e.dtype) == size]
    return sorted(pool, key=lambda e: (shape_distance(e.shape, shape), tuple(-x for x in e.shape)))


def nearest_entry(entries: dict[tuple, Entry], shape: Shape | AttentionShape, dtype: str) -> Entry | None:
    """The entry closest to ``shape`` by the rule in this module's docstring."""
    pool = _by_distance(entries, shape, dtype)
    return pool[0] if pool else None


def neighbour_entries(entries: dict[tuple, Entry], shape: Shape | AttentionShape, dtype: str,
                      max_distance: float = 1.0) -> list[Entry]:
    """The entries within ``max_distance`` of ``shape`` (:func:`shape_distance`) from the pool
    :func:`nearest_entry` draws on, nearest first, the entry at ``shape`` itself left out.
    With :data:`GEMM_DISTANCE_WEIGHTS` the default distance reaches N within a factor of 2,
    M within 4 and K within 16. The autotuner seeds a search with their configs."""
    return [e for e in _by_distance(entries, shape, dtype)
            if tuple(e.shape) != tuple(shape) and shape_distance(e.shape, shape) <= max_distance]


def untunable(gpu: str | None) -> str | None:
    """Why no config can be tuned on ``gpu``'s device, one that is not a GPU (the CPU's
    interpreters); None on a GPU."""
    if gpu is not None and _architecture(gpu) is None:
        return f"configs are tuned per GPU, and on {gpu} only Helion's or Triton's interpreter runs"
    return None


def tune_advice(kernel: str, shape: Shape | AttentionShape, dtype: str, gpu: str | None,
                lead: str = "Tune this shape with") -> str:
    """A fallback warning's last sentence: ``<lead>: <the command>`` (:func:`tune_command`), or
    on a device that is not a GPU why there is none (:func:`untunable`)."""
    reason = untunable(gpu)
    if reason is not None:
        return f"{reason[0].upper()}{reason[1:]}."
    return f"{lead}: {tune_command(kernel, shape, dtype, gpu)}"


def tune_command(kernel: str, shape: Shape | AttentionShape, dtype: str, gpu: str | None = None) -> str:
    """The CLI command that tunes ``kernel`` at ``shape`` (attention kernels tune workload
    rows, which carry the sequence lengths the config is timed on)."""
    if isinstance(shape, AttentionShape):
        return (f"helion-kernels autotune --kernel {kernel} --workload {ATTENTION_WORKLOAD} "
                f"--where 'H == {shape.H} and D == {shape.D}' --dtype {dtype}")
    return f"helion-kernels autotune --kernel {kernel} --shape {shape.M},{shape.K},{shape.N} --dtype {dtype}"


def lookup(kernel: str, shape: Shape | AttentionShape, dtype: torch.dtype | str, gpu: str,
           warn: bool = True) -> Lookup:
    """The entry a call of ``kernel`` at ``shape``/``dtype`` on ``gpu`` runs with (see the
    module docstring), warning with :class:`ConfigFallbackWarning` unless it is exact."""
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    entries, tuned_on = entries_for(kernel, gpu), gpu
    if not entries and (sibling := _same_architecture(kernel, gpu)) is not None:
        tuned_on, entries = sibling
    exact = entries.get((*shape, name))
    if exact is not None and tuned_on == gpu:
        return Lookup("exact", exact, gpu)
    near = exact or nearest_entry(entries, shape, name)
    if near is not None:
        if warn:
            where = "" if tuned_on == gpu else f" on {tuned_on} (same architecture)"
            warnings.warn(
                f"{kernel}: no config tuned for {shape} {name} on {gpu}; using the one tuned "
                f"for {near.shape} {near.dtype}{where}. {tune_advice(kernel, shape, name, gpu)}",
                ConfigFallbackWarning, stacklevel=3)
        return Lookup("nearest", near, tuned_on)
    if warn:
        what = f"no config for {name} or a dtype of its size" if entries else "no config"
        reason = untunable(gpu)  # the CPU: nothing to tune, and speed does not matter there
        advice = (f"as {reason}" if reason is not None else
                  f"which can be several times slower. {tune_advice(kernel, shape, name, gpu, 'Tune with')}")
        warnings.warn(
            f"{kernel}: the registry has {what} for {gpu}; using the conservative default config, {advice}",
            ConfigFallbackWarning, stacklevel=3)
    return Lookup("default", None)
