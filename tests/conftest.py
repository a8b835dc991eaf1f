import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True, scope="session")
def _private_cost_caches(tmp_path_factory: pytest.TempPathFactory):
    """The cost models that jobs of this session measure (``auto``'s all-reduce,
    ``topk:hierarchical=auto``'s) stay in folders of the session: never read from, nor left
    in, the user's ~/.cache, where a model measured on a loaded machine would steer later
    benchmarks."""
    names = {"DLCOMM_ALLREDUCE_MODEL_CACHE": "allreduce-models",
             "DLCOMM_COMPRESSION_COST_CACHE": "compression-costs"}
    previous = {name: os.environ.get(name) for name in names}
    for name, folder in names.items():
        os.environ[name] = str(tmp_path_factory.mktemp(folder))
    yield
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
