"""Fixtures for the Hugging Face tests: a tiny BERT trained on the CPU from a config (no hub
access), and a check that no capture outlives a test."""

from __future__ import annotations

import os
import time

import pytest

from gpumagic.capture import session as session_module


@pytest.fixture(autouse=True)
def no_capture_left():
    yield
    leftover = session_module.active_session()
    if leftover is not None:
        leftover.finish()
        pytest.fail("the test left a gpumagic capture running")


@pytest.fixture(scope="session")
def hf():
    """transformers, offline; the tests using it are skipped when it is not installed."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    return pytest.importorskip("transformers")


@pytest.fixture
def make_trainer(hf, tmp_path):
    """``make_trainer(callback, max_steps=6, item_s=0.004, fail_at=None, error=None)``: a Trainer on a
    tiny BERT whose dataset raises ``error`` (default a RuntimeError) from item ``fail_at`` on."""
    import torch

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, item_s: float, fail_at: int | None, error: BaseException | None) -> None:
            self.item_s, self.fail_at, self.error = item_s, fail_at, error

        def __len__(self) -> int:
            return 256

        def __getitem__(self, i: int):
            if self.fail_at is not None and i >= self.fail_at:
                raise self.error or RuntimeError("the dataset broke")
            time.sleep(self.item_s)  # a slow loader: the profile should find dataloader-bound
            g = torch.Generator().manual_seed(i)
            return {"input_ids": torch.randint(0, 100, (16,), generator=g),
                    "attention_mask": torch.ones(16, dtype=torch.long), "labels": torch.tensor(i % 2)}

    def make(callback, max_steps: int = 6, item_s: float = 0.004, fail_at: int | None = None,
             error: BaseException | None = None, **args):
        torch.manual_seed(0)
        config = hf.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                               vocab_size=100)
        model = hf.BertForSequenceClassification(config)
        training_args = hf.TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=max_steps, per_device_train_batch_size=8, report_to=[],
            use_cpu=True, logging_steps=1000, save_strategy="no", disable_tqdm=True, **args)
        return hf.Trainer(model=model, args=training_args, train_dataset=Tokens(item_s, fail_at, error),
                          callbacks=[callback] if callback is not None else [])

    return make
