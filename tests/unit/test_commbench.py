"""scalelab bench comm (issue #29, point 1): real gloo ranks time every collective; the table's
columns follow nccl-tests (algorithm and bus bandwidth); bad options are named."""

import pandas as pd
import pytest

from scalelab.cli import main
from scalelab.plan import comm_table
from scalelab.run import commbench


def test_message_sizes_and_bad_options(tmp_path, capsys):
    assert commbench.message_sizes(4096, 65536, 4) == [4096, 16384, 65536]
    assert commbench.message_sizes(4096, 100000, 4) == [4096, 16384, 65536, 100000]
    with pytest.raises(ValueError, match="min_bytes"):
        commbench.message_sizes(8192, 4096)
    out = str(tmp_path / "t.parquet")
    assert main(["bench", "comm", "--out", out, "--device", "cpu", "--world-sizes", "100000"]) == 2
    assert "needs more cores than" in capsys.readouterr().err
    assert main(["bench", "comm", "--out", out, "--device", "cpu", "--world-sizes", "two"]) == 2
    assert "--world-sizes must be comma-separated integers" in capsys.readouterr().err
    assert main(["bench", "comm", "--out", out, "--device", "cpu", "--world-sizes", "1", "--collectives", "all_to_all"]) == 2
    assert "unknown collective(s) all_to_all" in capsys.readouterr().err
    assert not (tmp_path / "t.parquet").exists()
    pd.DataFrame({"collective": ["all_reduce"]}).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="bad.parquet: not a bench comm table"):
        comm_table.read_table(tmp_path / "bad.parquet")
