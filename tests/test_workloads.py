from __future__ import annotations

import pytest

from helion_kernels import workloads
from helion_kernels.kernels.spec import Shape


def test_prenorm_table_matches_the_brief():
    df = workloads.load_workload("prenorm_rmsnorm")
    assert len(df) == 30
    assert set(df.M) == {65536, 131072, 524288}
    assert (df.query("K == 2048").N == 512).all() and len(df.query("K == 2048")) == 3
    assert len(workloads.load_workload("prenorm_rmsnorm", "M == 65536")) == 10


def test_unknown_workload_lists_known():
    with pytest.raises(ValueError, match="unknown workload 'nope'.*prenorm_rmsnorm"):
        workloads.load_workload("nope")


@pytest.mark.parametrize("where,message", [("Q === 3", "bad --where expression"), ("M", "must be a condition"),
                                           ("M == 3", "selects no row of workload 'prenorm_rmsnorm'")])
def test_bad_where(where, message):
    with pytest.raises(ValueError, match=message):
        workloads.load_workload("prenorm_rmsnorm", where)


@pytest.mark.parametrize("text,bad", [("M,K,N\n1,2\n", "positive"), ("M,K\n1,2\n", "missing column"),
                                      ("M,K,N\n1,0,3\n", "positive")])
def test_malformed_tables(registry_dir, text, bad):
    (registry_dir / "workloads" / "t.csv").write_text(text)
    with pytest.raises(ValueError, match=bad):
        workloads.load_workload("t")


def test_parse_shape():
    assert workloads.parse_shape("65536,1024,512") == Shape(65536, 1024, 512)
    assert workloads.parse_shape("8x16x32") == Shape(8, 16, 32)
    for bad in ["1,2", "a,b,c", "1,2,0", "1,2,3,4"]:
        with pytest.raises(ValueError, match="M,K,N"):
            workloads.parse_shape(bad)
