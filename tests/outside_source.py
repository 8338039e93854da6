"""The source of a predictor module outside the repository, as the tests write it into a
``predictors_path`` folder: a per-token line, registered under the name asked for."""

TOY = '''
from leaderboard_core.contract import PredictorCard
from predictors.base import Predictor
from predictors.registry import register


@register("NAME")
class Toy(Predictor):
    card = PredictorCard(kind="analytical", reference="a test", description="a per-token line",
                         needs_profiled_rows=False)

    def __init__(self, us_per_token: float = 1.0):
        self.us_per_token = us_per_token

    def predict(self, cells, gpu):
        return 1.0 + cells["total_tokens"].to_numpy() * self.us_per_token * 1e-3
'''


def toy(name: str) -> str:
    """The module's source, registering ``name``."""
    return TOY.replace("NAME", name)
