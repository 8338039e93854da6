"""Runs inside aiconfigurator's own virtualenv, never the suite's (the seal refuses an environment
that holds the package, which bundles other GPUs' measured tables): reads the requests that
``python -m leaderboard.reference`` wrote, answers each with aiconfigurator's own TTFT and TPOT
estimate, and writes them out. It imports nothing of the suite.

    <venv>/bin/python aiconfigurator_worker.py REQUESTS.json ESTIMATES.json
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path


def model_path(aliases: list[str], configs: Path) -> str | None:
    """The first of a model's names aiconfigurator ships a config for (``org--name_config.json``)."""
    return next((a for a in aliases if "/" in a
                 and (configs / f"{a.replace('/', '--')}_config.json").is_file()), None)


def main(requests_path: str, estimates_path: str) -> int:
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    import aiconfigurator_core
    from aiconfigurator.cli.api import cli_estimate

    configs = Path(aiconfigurator_core.__file__).parent / "model_configs"
    requests = json.loads(Path(requests_path).read_text())
    answers, asked_before = [], {}
    for i, r in enumerate(requests):
        answer = {"target_id": r["target_id"], "dataset": r["dataset"]}
        name = model_path(r["model_aliases"], configs)
        config = json.dumps({k: v for k, v in r.items() if k not in answer}, sort_keys=True)
        if name is None:
            answer["error"] = f"no model config for {r['model_aliases'][0]}"
        elif config in asked_before:  # another run of the same configuration: the same estimate
            answer.update(asked_before[config])
        else:
            try:
                estimate = cli_estimate(
                    name, r["system"], backend_name=r["backend"], isl=r["isl"], osl=r["osl"],
                    batch_size=r["concurrency"], tp_size=r["tp"], moe_tp_size=r["moe_tp"],
                    moe_ep_size=r["moe_ep"], gemm_quant_mode=r["gemm_quant"],
                    moe_quant_mode=r["moe_quant"], kvcache_quant_mode="bfloat16",
                    fmha_quant_mode="bfloat16")
                answer.update(model_path=name, ttft_ms=float(estimate.ttft),
                              tpot_ms=float(estimate.tpot),
                              database_version=str(estimate.backend_version))
            except Exception as exc:  # noqa: BLE001 - one config it cannot price is one answer
                answer["error"] = f"{type(exc).__name__}: {exc}"[:300]
            asked_before[config] = {k: v for k, v in answer.items()
                                    if k not in ("target_id", "dataset")}
        answers.append(answer)
        if (i + 1) % 25 == 0 or i + 1 == len(requests):
            print(f"aiconfigurator: {i + 1}/{len(requests)} estimates", file=sys.stderr, flush=True)
    Path(estimates_path).write_text(json.dumps(answers, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
