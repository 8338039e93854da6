"""What fit may read: the home dataset's training cells and the measured points behind them.

The home of a dataset is named in ``conf/dataset/<name>.yaml`` or, when that says null, is the
A100 dataset of the same family (``h200_vidur`` -> ``a100_vidur``). The home's op points are the
points its *training* cells were composed from (their lineage), so a held-out cell is never a
sum of points the predictor was fitted on unless a training cell shares that point.
"""

from __future__ import annotations

import polars as pl
import yaml

from leaderboard import paths
from predictors.base import Home
from predictors.registry import suggestion


def family(name: str) -> str:
    return name.rsplit("_", 1)[-1]


def conf_home(name: str) -> str | None:
    """The home ``conf/dataset/<name>.yaml`` names (the llmservingsim family names the A6000), or
    None: then the home is the A100 dataset of the same family (``home_of``)."""
    conf = paths.CONF_DIR / "dataset" / f"{name}.yaml"
    return yaml.safe_load(conf.read_text()).get("home") if conf.is_file() else None


def require_dataset(rows: dict[str, dict], name: str) -> dict:
    if name not in rows:
        raise ValueError(f"unknown dataset '{name}'; {suggestion(name, sorted(rows))}")
    return rows[name]


def home_of(name: str, named_home: str | None, rows: dict[str, dict]) -> str:
    """``named_home`` (a ``dataset.home=`` override), else the home the dataset's conf file
    names, else the A100 dataset of its family."""
    named_home = named_home or conf_home(name)
    if named_home:
        return require_dataset(rows, named_home)["name"]
    a100 = sorted(n for n in rows if family(n) == family(name) and n.startswith("a100"))
    if not a100:
        raise ValueError(f"the {family(name)} family has no A100 dataset to fit on; name its home "
                         f"in conf/dataset/{name}.yaml (home: <dataset>) or pass dataset.home=...")
    return a100[0]


def op_points(lineage: pl.DataFrame, cell_ids: list[str]) -> dict[str, pl.DataFrame]:
    """Per lineage op (``gemm_qkv``, ``attn_decode``, ``allreduce``...): one row per distinct
    measured point of the given cells, its key fields as columns plus ``latency_ms``."""
    used = lineage.filter(pl.col("cell_id").is_in(cell_ids))
    out = {}
    for (op,), group in used.group_by("op", maintain_order=True):
        points = group.unique("key", maintain_order=True)
        keys = points["key"].str.json_decode(infer_schema_length=None).struct.unnest()
        out[op] = pl.concat([keys, points.select("latency_ms")], how="horizontal")
    return dict(sorted(out.items()))


def build_home(catalog, row: dict, train: pl.DataFrame, gpu, models) -> Home:
    return Home(sku=row["sku"], gpu=gpu, dataset=row["name"], cells=train,
                ops=op_points(catalog.lineage(row["name"]), train["cell_id"].to_list()),
                models=models, published=catalog.coefficients())
