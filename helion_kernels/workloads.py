"""Workload tables: CSV files under ``configs/workloads/`` read with pandas.

A table has integer columns ``M``, ``K``, ``N`` (one GEMM shape per row) and may start
with ``#`` comment lines naming its source.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .kernels.spec import Shape
from .registry import config_dir

COLUMNS = ("M", "K", "N")


def workload_dir() -> Path:
    return config_dir() / "workloads"


def list_workloads() -> list[str]:
    return sorted(p.stem for p in workload_dir().glob("*.csv"))


def load_workload(name: str, where: str | None = None) -> pd.DataFrame:
    """The rows of workload ``name``, optionally filtered by a pandas query (``"M == 65536"``).

    Raises:
        ValueError: unknown workload, missing or non-positive M/K/N, or a bad query.
    """
    path = workload_dir() / f"{name}.csv"
    if not path.is_file():
        raise ValueError(
            f"unknown workload {name!r} (no {path}); known: {', '.join(list_workloads()) or 'none'}"
        )
    df = pd.read_csv(path, comment="#", skipinitialspace=True)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; expected {list(COLUMNS)}")
    if df[list(COLUMNS)].isna().any().any() or not (df[list(COLUMNS)] > 0).all().all():
        raise ValueError(f"{path}: M, K and N must be positive integers in every row")
    df = df.astype({c: "int64" for c in COLUMNS})
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
