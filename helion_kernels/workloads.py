"""Workload tables: CSV files read with pandas, which may start with ``#`` comment lines
naming their source. They ship with the registry (:func:`~.registry.shipped_dir`); a table
of the same name in the user registry (:func:`~.registry.user_dir`) is read instead.

* GEMM workloads, ``workloads/<name>.csv``: integer columns ``M``, ``K``, ``N`` (one GEMM
  shape per row, a :class:`~.spec.Shape`).
* Attention workloads, ``attention_workloads/<name>.csv``: ``batch``, ``H``, ``D``,
  ``max_seq_len_q``, ``seq_len_kv`` (dense KV), ``fill`` (average Q length over
  ``max_seq_len_q``, in (0, 1]) and ``seed`` of the Q lengths (a
  :class:`~.spec.AttentionRow`).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pandas as pd

from .registry import shipped_dir, user_dir
from .spec import AttentionRow, Shape

COLUMNS = ("M", "K", "N")
ATTENTION_COLUMNS = ("batch", "H", "D", "max_seq_len_q", "seq_len_kv", "fill", "seed")
# kind -> (folder in a registry root, required columns, row type)
KINDS = {"gemm": ("workloads", COLUMNS, Shape),
         "attention": ("attention_workloads", ATTENTION_COLUMNS, AttentionRow)}


def _path(name: str, kind: str) -> Path | None:
    """The table's file, the user registry's first; None if neither has it."""
    for root in (user_dir(), shipped_dir()):
        path = root / KINDS[kind][0] / f"{name}.csv"
        if path.is_file():
            return path
    return None


def replaces_shipped(name: str, kind: str = "gemm") -> bool:
    """Whether the user registry's table ``name`` is read in place of a different shipped table
    of that name (a copy of the shipped one changes nothing)."""
    folder = KINDS[kind][0]
    user, shipped = user_dir() / folder / f"{name}.csv", shipped_dir() / folder / f"{name}.csv"
    return user.is_file() and shipped.is_file() and user.read_bytes() != shipped.read_bytes()


def list_workloads(kind: str = "gemm") -> list[str]:
    folder = KINDS[kind][0]
    return sorted({p.stem for root in (user_dir(), shipped_dir()) for p in (root / folder).glob("*.csv")})


WHERE_SUFFIX_MAX = 48  # characters of a query kept in a file name; longer ones are cut and hashed
_COMPARISONS = {"<=": "le", ">=": "ge", "!=": "ne", "<": "lt", ">": "gt"}  # "==" stays unnamed


def where_suffix(where: str | None) -> str:
    """The part of a variant run's file name that says which rows a ``--where`` query selected:
    ``"M == 65536"`` -> ``"_M_65536"``, ``"K <= 1024"`` -> ``"_K_le_1024"`` (every comparison
    but ``==`` is named, so ``K <= 1024`` and ``K == 1024`` never share a file); "" without a
    query. A query longer than :data:`WHERE_SUFFIX_MAX` characters once cleaned is cut at the
    last word boundary within them and ends with 8 hex digits of its SHA-1, so names stay short
    (file systems refuse names past 255 bytes) and distinct; the run's ``.md`` records the
    whole command. (An op's benchmark merges its rows into one table instead.)"""
    if not where:
        return ""
    named = re.sub(r"<=|>=|!=|<|>", lambda op: f" {_COMPARISONS[op.group()]} ", where)
    words = re.sub(r"[^A-Za-z0-9]+", "_", named).strip("_")
    if len(words) > WHERE_SUFFIX_MAX:  # cut between words, so no number is cut short
        cut = words[:WHERE_SUFFIX_MAX + 1]
        words = cut[:cut.rfind("_")] if "_" in cut else cut[:WHERE_SUFFIX_MAX]
        words += "_" + hashlib.sha1(where.encode()).hexdigest()[:8]
    return "_" + words


def load_workload(name: str, where: str | None = None, kind: str = "gemm") -> pd.DataFrame:
    """The rows of workload ``name``, optionally filtered by a pandas query (``"M == 65536"``).

    Raises:
        ValueError: unknown workload, a file that is not a CSV table or has no rows, missing
            columns, a count or size that is not a positive integer (``seed`` may be 0,
            ``fill`` must lie in (0, 1]), or a bad query.
    """
    path = _path(name, kind)
    columns = KINDS[kind][1]
    if path is None:
        other = next((k for k in KINDS if k != kind and name in list_workloads(k)), None)
        hint = (f"; {name!r} is an {other} workload (--kernel flash_norm_attention)" if other == "attention"
                else f"; {name!r} is a {other} workload, for the GEMM-shaped kernels" if other else "")
        raise ValueError(
            f"unknown {kind} workload {name!r}; known: {', '.join(list_workloads(kind)) or 'none'}{hint}"
        )
    try:
        df = pd.read_csv(path, comment="#", skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a CSV table ({err})") from err
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; expected {list(columns)}")
    if df.empty:
        raise ValueError(f"{path}: no rows")
    ints = [c for c in columns if c != "fill"]
    df[list(columns)] = df[list(columns)].apply(pd.to_numeric, errors="coerce")  # text -> NaN, refused below
    if df[list(columns)].isna().any().any() or not (df[ints] == df[ints].round()).all().all():
        raise ValueError(f"{path}: {', '.join(ints)} must be positive integers in every row")
    sizes = [c for c in ints if c != "seed"]
    if not (df[sizes] > 0).all().all() or ("seed" in df and (df["seed"] < 0).any()):
        raise ValueError(f"{path}: {', '.join(sizes)} must be positive integers in every row")
    if "fill" in columns and not ((df["fill"] > 0) & (df["fill"] <= 1)).all():
        raise ValueError(f"{path}: fill must lie in (0, 1] in every row")
    df = df.astype({c: "int64" for c in ints})
    if where:
        try:
            mask = df.eval(where)
        except Exception as err:  # pandas raises many types for a bad expression
            raise ValueError(f"bad --where expression {where!r}: {err} (columns: {', '.join(df.columns)})") from err
        if not (isinstance(mask, pd.Series) and mask.dtype == bool):
            raise ValueError(f"bad --where expression {where!r}: it must be a condition, e.g. 'M == 65536'")
        df = df[mask]
        if df.empty:
            raise ValueError(f"--where {where!r} selects no row of workload {name!r}")
    return df.reset_index(drop=True)


def problems(df: pd.DataFrame, kind: str = "gemm") -> list:
    """The rows of a loaded table as problems: :class:`~.spec.Shape` or
    :class:`~.spec.AttentionRow`."""
    _, columns, row_type = KINDS[kind]
    return [row_type(*(float(r[c]) if c == "fill" else int(r[c]) for c in columns))
            for r in df.to_dict("records")]


def parse_shape(text: str) -> Shape:
    """``"65536,1024,512"`` (or ``"65536x1024x512"``) -> Shape(65536, 1024, 512); ValueError otherwise."""
    try:
        m, k, n = (int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise ValueError(f"shape must be M,K,N or MxKxN (three positive integers), got {text!r}") from None
    if min(m, k, n) <= 0:
        raise ValueError(f"shape must be M,K,N or MxKxN (three positive integers), got {text!r}")
    return Shape(m, k, n)


def shape_argument(text: str) -> Shape:
    """:func:`parse_shape` as an ``argparse`` ``type=``: its ValueError as an ArgumentTypeError."""
    import argparse

    try:
        return parse_shape(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
