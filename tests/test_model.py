"""A local checkpoint is refused before anything trains when it cannot be the model it claims to be."""

from __future__ import annotations

import json
import shutil

import pytest

from peltbench import UserError
from peltbench.model import load_config, load_tokenizer


@pytest.fixture
def checkpoint(tmp_path, tiny_checkpoint):
    """A copy of the tiny checkpoint that a test may damage."""
    load_tokenizer.cache_clear()
    yield shutil.copytree(tiny_checkpoint, tmp_path / "tiny-bert")
    load_tokenizer.cache_clear()


def test_the_tiny_checkpoint_loads(checkpoint):
    tokenizer = load_tokenizer(str(checkpoint))
    assert len(tokenizer) == load_config(str(checkpoint)).vocab_size == 64
    assert tokenizer("the cat sat")["input_ids"][1:-1] != [tokenizer.unk_token_id] * 3


def test_a_checkpoint_without_tokenizer_files_is_refused(checkpoint):
    """transformers 5 would build a 5-token tokenizer here: every word [UNK], and the run would end `ok`."""
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        (checkpoint / name).unlink()
    with pytest.raises(UserError, match=rf"^model.name={checkpoint}: no tokenizer in {checkpoint} \(no "
                                        r"tokenizer.json, vocab.txt, vocab.json or spm.model\)"):
        load_tokenizer(str(checkpoint))


def test_a_tokenizer_of_another_vocabulary_is_refused(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "vocab_size": 30522}))  # a BERT-base embedding
    with pytest.raises(UserError, match=r"its tokenizer has 64 tokens but the model's embedding has 30522 rows"):
        load_tokenizer(str(checkpoint))


def test_a_tokenizer_larger_than_the_embedding_is_refused(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "vocab_size": 48}))  # ids 48..63 would crash
    with pytest.raises(UserError, match=r"its tokenizer has 64 tokens but the model's embedding has 48 rows"):
        load_tokenizer(str(checkpoint))


def test_an_embedding_padded_to_a_multiple_of_64_is_accepted(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    vocab = (checkpoint / "vocab.txt").read_text().splitlines()[:60]  # 60 tokens, embedding 64 rows
    (checkpoint / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (checkpoint / "tokenizer.json").unlink()
    assert config["vocab_size"] == 64 and len(load_tokenizer(str(checkpoint))) == 60


def test_an_empty_or_missing_directory_is_named_as_such(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=rf"^model.name={tmp_path / 'empty'} is not a checkpoint: no config.json in "):
        load_tokenizer(str(tmp_path / "empty"))
    with pytest.raises(UserError, match=rf"^model.name={tmp_path / 'nowhere'}: no such directory$"):
        load_tokenizer(str(tmp_path / "nowhere"))


def test_loading_writes_no_progress_bar_into_a_log_file(tiny_checkpoint, tmp_path):
    """Issue 21, 3g: transformers' "Loading weights" bar wrote carriage returns into log files (stderr not a terminal),
    where peltbench's own bars are off."""
    import os
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key != "TQDM_DISABLE"}  # conftest sets it
    script = f"from peltbench.model import load_backbone; load_backbone({str(tiny_checkpoint)!r}, 2, 42); print('loaded')"
    with open(tmp_path / "log", "w") as log:
        result = subprocess.run([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT, env=env, timeout=120)
    text = (tmp_path / "log").read_text()
    assert result.returncode == 0 and text.endswith("loaded\n"), text
    assert "\r" not in text and "Loading weights" not in text
