import pytest
from render_helpers import analysed


@pytest.fixture(scope="session")
def small_report():
    """The smallest fixture (2.5k events): cheap enough for widget and mimebundle tests."""
    return analysed("h100_bert_small_inference")


@pytest.fixture(scope="session")
def loader_report():
    """ResNet-50 with num_workers=0: several findings, evidence windows, pageable copies."""
    return analysed("resnet50_v100_workers0")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (``item.rep_call``) for failure screenshots."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep
