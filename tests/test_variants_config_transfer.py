"""The config-transfer variant's table (``bench/variants/config_transfer.py``): which dimension
changed, and each neighbour's time over the row's own config's (or the best candidate's)."""

from __future__ import annotations

import math

import config_transfer  # bench/variants


def _row(m, k, n, frm, ms):
    return {"M": m, "K": k, "N": n, "config_from": str(frm), "d_M": math.log2(frm[0] / m),
            "d_K": math.log2(frm[1] / k), "d_N": math.log2(frm[2] / n), "ms": ms, "note": ""}


def test_vs_own_and_changed_dimension():
    rows = [_row(64, 256, 256, (64, 256, 256), 2.0), _row(64, 256, 256, (64, 512, 256), 2.5),
            _row(64, 256, 256, (128, 256, 512), 3.0),
            # no own entry: relative to the best candidate
            _row(64, 1024, 256, (64, 512, 256), 4.0), _row(64, 1024, 256, (64, 1024, 512), 5.0)]
    df = config_transfer.transfer_table(rows)
    assert list(df.changed) == ["own", "K", "M+N", "K", "N"]
    assert list(df.vs_own) == [1.0, 1.25, 1.5, 1.0, 1.25]
    assert list(df.own_entry) == [True, True, True, False, False]


def test_empty():
    assert config_transfer.transfer_table([]).empty


def test_neighbours_are_counted_in_plain_factors_of_two():
    from helion_kernels.spec import Shape

    from helion_kernels import registry

    assert registry.shape_distance(Shape(64, 256, 256), Shape(128, 256, 1024), config_transfer.UNWEIGHTED) == 3
