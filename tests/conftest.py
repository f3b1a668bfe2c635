import os
import sys

import pytest

HERE = os.path.dirname(__file__)
DATA = os.path.join(HERE, "data")
sys.path.insert(0, HERE)


@pytest.fixture(scope="session")
def data_dir() -> str:
    return DATA
