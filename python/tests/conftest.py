import numpy as np
import pytest

import retrace


@pytest.fixture
def device():
    d = retrace.open_device("cpu")
    yield d
    d.close()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
