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


class SharedLab:
    """The session's one JupyterLab server (one per pytest-xdist worker, which runs whole modules
    under ``--dist loadfile``): ``url`` and the ``root`` it serves. Each browser test module works
    in a folder of its own (:meth:`folder`) and stops its kernels when it is done, so modules share
    the server's start-up cost and nothing else."""

    def __init__(self, url, root, home):
        self.url, self.root, self.home = url, root, home

    def folder(self, name: str):
        """A new, empty folder ``root/name`` for one module's notebooks; JupyterLab's theme back to
        its default (Light), whatever a module before switched it to."""
        path = self.root / name
        path.mkdir()
        (self.home / "settings" / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings").unlink(missing_ok=True)
        return path

    def lab_url(self, name: str, notebook: str) -> str:
        """JupyterLab on ``name/notebook`` in a workspace of that notebook's own: no document another
        test left open is restored beside it (and made the current one)."""
        return f"{self.url}/lab/workspaces/{name}-{notebook.rsplit('.', 1)[0]}/tree/{name}/{notebook}"


@pytest.fixture(scope="session")
def shared_lab(tmp_path_factory):
    """One token-less JupyterLab (with Notebook 7 where installed) on 127.0.0.1 for the session."""
    from browser_helpers import jupyter_server

    home = tmp_path_factory.mktemp("jupyter")
    root = home / "root"
    root.mkdir()
    with jupyter_server(home, root) as url:
        yield SharedLab(url, root, home)
