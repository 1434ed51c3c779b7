from __future__ import annotations

import pytest

from helion_kernels import workloads
from helion_kernels.spec import Shape


def test_prenorm_table_matches_the_brief():
    df = workloads.load_workload("prenorm_rmsnorm")
    assert len(df) == 30
    assert set(df.M) == {65536, 131072, 524288}
    assert (df.query("K == 2048").N == 512).all() and len(df.query("K == 2048")) == 3
    assert len(workloads.load_workload("prenorm_rmsnorm", "M == 65536")) == 10


def test_unknown_workload_lists_known():
    with pytest.raises(ValueError, match="unknown gemm workload 'nope'.*prenorm_rmsnorm"):
        workloads.load_workload("nope")


@pytest.mark.parametrize("where,message", [("Q === 3", "bad --where expression"), ("M", "must be a condition"),
                                           ("M == 3", "selects no row of workload 'prenorm_rmsnorm'")])
def test_bad_where(where, message):
    with pytest.raises(ValueError, match=message):
        workloads.load_workload("prenorm_rmsnorm", where)


@pytest.mark.parametrize("text,bad", [("M,K,N\n1,2\n", "positive"), ("M,K\n1,2\n", "missing column"),
                                      ("M,K,N\n1,0,3\n", "positive"), ("M,K,N\n64,100,abc\n", "positive"),
                                      ("M,K,N\n", "no rows"), ("", "not a CSV table")])
def test_malformed_tables(registry_dir, text, bad):
    (registry_dir / "workloads" / "t.csv").write_text(text)
    with pytest.raises(ValueError, match=f"t.csv: .*{bad}"):
        workloads.load_workload("t")


def test_parse_shape():
    assert workloads.parse_shape("65536,1024,512") == Shape(65536, 1024, 512)
    assert workloads.parse_shape("8x16x32") == Shape(8, 16, 32)
    for bad in ["1,2", "a,b,c", "1,2,0", "1,2,3,4"]:
        with pytest.raises(ValueError, match="M,K,N"):
            workloads.parse_shape(bad)


def test_attention_table_matches_the_issue():
    df = workloads.load_workload("flash_norm_attention", kind="attention")
    assert len(df) == 15 and set(df.H) == {2, 4, 8} and set(df.D) == {128}
    assert set(df.max_seq_len_q) == {256, 512, 1024, 2048, 3000}
    assert (df.batch == 768).all() and (df.seq_len_kv == 128).all() and (df.fill == 0.5).all()
    assert len(workloads.load_workload("flash_norm_attention", "H == 4", kind="attention")) == 5
    assert "flash_norm_attention" not in workloads.list_workloads()  # not a GEMM table


@pytest.mark.parametrize("row,bad", [("768,2,128,256,128,1.5,0", "fill"), ("768,2,128,256,128,0.5,-1", "positive"),
                                     ("768,0,128,256,128,0.5,0", "positive"), ("768,2,128,256.5,128,0.5,0", "integers")])
def test_malformed_attention_tables(registry_dir, row, bad):
    (registry_dir / "attention_workloads").mkdir()
    (registry_dir / "attention_workloads" / "t.csv").write_text(
        "batch,H,D,max_seq_len_q,seq_len_kv,fill,seed\n" + row + "\n")
    with pytest.raises(ValueError, match=bad):
        workloads.load_workload("t", kind="attention")


def test_where_suffix_names_the_selected_rows():
    """The committed result files are named with it (``..._M_65536``)."""
    from helion_kernels.workloads import where_suffix

    assert where_suffix("M == 65536") == "_M_65536"
    assert where_suffix("K == 512 and N >= 2048") == "_K_512_and_N_ge_2048"
    # Two queries that select different rows never share a file (they once did: the comparison
    # was dropped, and 'K <= 1024' overwrote 'K == 1024').
    names = [where_suffix(f"K {op} 1024") for op in ("==", "<=", ">=", "<", ">", "!=")]
    assert names == ["_K_1024", "_K_le_1024", "_K_ge_1024", "_K_lt_1024", "_K_gt_1024", "_K_ne_1024"]
    assert where_suffix(None) == where_suffix("") == ""


def test_where_suffix_of_a_long_query_is_short_and_distinct():
    """A query naming several shapes once gave a 190-character file name; it is cut between
    words (never inside a number) and ends with a hash of the whole query."""
    from helion_kernels.workloads import WHERE_SUFFIX_MAX, where_suffix

    shared = "(M == 65536 and K == 256 and N == 256) or (M == 65536 and K == 512 and N == 512)"
    one, two = where_suffix(shared + " or N == 1"), where_suffix(shared + " or N == 2")
    assert one != two and one[:-9] == two[:-9]  # the same words, told apart by the hash alone
    assert len(one) <= 1 + WHERE_SUFFIX_MAX + 9
    assert one[:-9] == "_M_65536_and_K_256_and_N_256_or_M_65536_and_K_512"
    tricky = where_suffix("(M == 65536 and K == 256 and N == 256) or (M == 131072 and K == 512 and N == 1024)")
    assert tricky.startswith("_M_65536_and_K_256_and_N_256_or_M_131072_and_K_") and "_K_51_" not in tricky
    assert where_suffix("M == 65536") == "_M_65536"  # short queries keep their whole name
