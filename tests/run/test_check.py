"""``check_predictor`` a user can trust: explicit errors that name the rule and the offending
cells (``python -O`` checks the same), and a sealed mode (``python -m leaderboard.check``) that
fails a predictor reaching for the measurements."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from leaderboard_core import paths

NAN = '''
import numpy as np
from leaderboard_core.contract import PredictorCard
from predictors.base import Predictor
from predictors.registry import register


@register("NAME")
class Broken(Predictor):
    card = PredictorCard(kind="analytical", reference="a test", description="NaN on decode",
                         needs_profiled_rows=False)

    def fit(self, home):
        FIT
        return self

    def predict(self, cells, gpu):
        return np.where(cells["num_decode"].to_numpy() > 0, np.nan, 1.0)
'''


def test_python_o_still_fails_a_nan_prediction_and_names_the_cells(tmp_path):
    (tmp_path / "broken.py").write_text(NAN.replace("NAME", "broken_nan").replace("FIT", "pass"))
    script = textwrap.dedent(f'''
        import sys
        sys.path.append({str(tmp_path)!r})
        import broken
        from predictors.checks import ContractError, check_predictor
        try:
            check_predictor(broken.Broken)
        except ContractError as exc:
            print("FAILED", exc)
        else:
            print("PASSED")
    ''')
    out = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True,
                         cwd=paths.REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("FAILED Broken: predictions must be finite and positive (ms)")
    assert "first h100_sxm-tp1-3 (decode, 1 requests" in out.stdout and ": nan" in out.stdout


def test_the_sealed_check_fails_a_read_of_the_data_folder(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    pins = paths.DATASETS_DIR / "upstream_pins.json"
    peek = f"try:\n            open({str(pins)!r}).read()\n        except OSError:\n            pass"
    (folder / "peeker.py").write_text(NAN.replace("NAME", "peeker").replace("FIT", peek))
    out = subprocess.run([sys.executable, "-m", "leaderboard.check", "predictor=peeker",
                          f"predictors_path={folder}"], capture_output=True, text=True,
                         cwd=paths.REPO_ROOT, timeout=120,
                         env={**os.environ, "LEADERBOARD_HOME": str(tmp_path / "home")})
    assert out.returncode == 1
    assert "reached for sealed data" in out.stderr and "upstream_pins.json" in out.stderr


def test_the_sealed_check_passes_a_sound_predictor(tmp_path):
    out = subprocess.run([sys.executable, "-m", "leaderboard.check", "predictor=llm_viewer"],
                         capture_output=True, text=True, cwd=paths.REPO_ROOT, timeout=120,
                         env={**os.environ, "LEADERBOARD_HOME": str(tmp_path / "home")})
    assert out.returncode == 0, out.stderr
    assert "llm_viewer passes the check (parameters, fit, predict), sealed" in out.stderr


def test_the_example_of_docs_predictors_passes_the_sealed_check(tmp_path):
    """The copy-paste example of docs/predictors.md, as a user would save it, outside the repo."""
    import re

    text = (paths.REPO_ROOT / "docs" / "predictors.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "@register(" in b]
    folder = tmp_path / "my_predictors"
    folder.mkdir()
    (folder / "token_line.py").write_text(code)
    out = subprocess.run([sys.executable, "-m", "leaderboard.check", "predictor=token_line",
                          f"predictors_path={folder}"], capture_output=True, text=True,
                         cwd=paths.REPO_ROOT, timeout=120,
                         env={**os.environ, "LEADERBOARD_HOME": str(tmp_path / "home")})
    assert out.returncode == 0, out.stderr
    assert "token_line passes the check (parameters, fit, predict)" in out.stderr
