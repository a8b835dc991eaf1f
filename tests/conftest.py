import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True, scope="session")
def _private_allreduce_model_cache(tmp_path_factory: pytest.TempPathFactory):
    """The all-reduce cost models that jobs of this session measure (``auto``) stay in a
    folder of the session: never read from, nor left in, the user's ~/.cache, where a model
    measured on a loaded machine would steer later benchmarks."""
    name = "DLCOMM_ALLREDUCE_MODEL_CACHE"
    previous = os.environ.get(name)
    os.environ[name] = str(tmp_path_factory.mktemp("allreduce-models"))
    yield
    if previous is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = previous
