"""Workload tables: CSV files read with pandas, which may start with ``#`` comment lines
naming their source.

* GEMM workloads, ``configs/workloads/<name>.csv``: integer columns ``M``, ``K``, ``N`` (one
  GEMM shape per row).
* Attention workloads, ``configs/attention_workloads/<name>.csv``: ``batch``, ``H``, ``D``,
  ``max_seq_len_q``, ``seq_len_kv`` (dense KV), ``fill`` (average Q length over
  ``max_seq_len_q``, in (0, 1]) and ``seed`` of the Q lengths
  (:func:`~.kernels.gdpa.jagged_lengths`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .kernels.spec import Shape
from .registry import config_dir

COLUMNS = ("M", "K", "N")
ATTENTION_COLUMNS = ("batch", "H", "D", "max_seq_len_q", "seq_len_kv", "fill", "seed")
# kind -> (folder under configs/, required columns)
KINDS = {"gemm": ("workloads", COLUMNS), "attention": ("attention_workloads", ATTENTION_COLUMNS)}


def workload_dir(kind: str = "gemm") -> Path:
    return config_dir() / KINDS[kind][0]


def list_workloads(kind: str = "gemm") -> list[str]:
    return sorted(p.stem for p in workload_dir(kind).glob("*.csv"))


def load_workload(name: str, where: str | None = None, kind: str = "gemm") -> pd.DataFrame:
    """The rows of workload ``name``, optionally filtered by a pandas query (``"M == 65536"``).

    Raises:
        ValueError: unknown workload, missing columns, a count or size that is not a
            positive integer (``seed`` may be 0, ``fill`` must lie in (0, 1]), or a bad query.
    """
    path = workload_dir(kind) / f"{name}.csv"
    columns = KINDS[kind][1]
    if not path.is_file():
        other = next((k for k in KINDS if k != kind and name in list_workloads(k)), None)
        hint = (f"; {name!r} is an {other} workload (--kernel flash_norm_attention)" if other == "attention"
                else f"; {name!r} is a {other} workload, for the GEMM-shaped kernels" if other else "")
        raise ValueError(
            f"unknown workload {name!r} (no {path}); known: {', '.join(list_workloads(kind)) or 'none'}{hint}"
        )
    df = pd.read_csv(path, comment="#", skipinitialspace=True)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; expected {list(columns)}")
    ints = [c for c in columns if c != "fill"]
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
            raise ValueError(f"bad --where expression {where!r}: {err}") from err
        if not (isinstance(mask, pd.Series) and mask.dtype == bool):
            raise ValueError(f"bad --where expression {where!r}: it must be a condition, e.g. 'M == 65536'")
        df = df[mask]
        if df.empty:
            raise ValueError(f"--where {where!r} selects no row of workload {name!r}")
    return df.reset_index(drop=True)


def shapes(df: pd.DataFrame) -> list[Shape]:
    return [Shape(int(r.M), int(r.K), int(r.N)) for r in df.itertuples()]


def parse_shape(text: str) -> Shape:
    """``"65536,1024,512"`` -> Shape(65536, 1024, 512); ValueError otherwise."""
    try:
        m, k, n = (int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise ValueError(f"shape must be M,K,N (three positive integers), got {text!r}") from None
    if min(m, k, n) <= 0:
        raise ValueError(f"shape must be M,K,N (three positive integers), got {text!r}")
    return Shape(m, k, n)
