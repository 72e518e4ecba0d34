"""SuperGLUE text data (landscape.data.text) and the Hugging Face classifier wrapper
(landscape.models.text), on tiny files written here in SuperGLUE's real format and a tiny BERT saved
with safetensors. References: the tokenizer's own encoding of each pair, ids counted by hand from
the vocabulary written here, SuperGLUE / Hugging Face ``super_glue`` label numbers, the
transformers model's own logits, the safetensors file's tensors, and a recomputation of the run's
accuracy from its saved weights."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from landscape.data import load_dataset  # noqa: E402
from landscape.data.text import TEXT_MODEL_ENV, load_superglue  # noqa: E402
from landscape.models import count_parameters, model_factory  # noqa: E402
from tests.synthetic_files import tiny_bert, tiny_bert_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ":", "?", "."] + (
    "the cat sat on a mat dog is not ran it was did bank river money run fast slow word".split()
)
ID = {w: i for i, w in enumerate(VOCAB)}

RTE = [
    {"premise": "the cat sat on a mat.", "hypothesis": "the cat sat.", "label": "entailment", "idx": 0},
    {"premise": "the dog ran fast.", "hypothesis": "the dog is slow.", "label": "not_entailment", "idx": 1},
    {"premise": "it was a cat.", "hypothesis": "it was a dog.", "label": "not_entailment", "idx": 2},
    {"premise": "the dog ran.", "hypothesis": "the dog did run.", "label": "entailment", "idx": 3},
    {
        "premise": "a cat is on the mat.",
        "hypothesis": "the mat is not on a cat.",
        "label": "entailment",
        "idx": 4,
    },
    {"premise": "the river bank.", "hypothesis": "the money bank.", "label": "not_entailment", "idx": 5},
]
BOOLQ = [
    {"question": "is the cat on a mat", "passage": "the cat sat on a mat. " * 6, "label": True, "idx": 0},
    {"question": "did the dog run", "passage": "the dog was slow.", "label": False, "idx": 1},
]
WIC = [
    {"word": "bank", "sentence1": "the river bank.", "sentence2": "the money bank.", "idx": 0, "label": False,
     "start1": 10, "end1": 14, "start2": 10, "end2": 14},
    {"word": "run", "sentence1": "the dog did run.", "sentence2": "the cat did run fast.", "idx": 1,
     "label": True, "start1": 12, "end1": 15, "start2": 12, "end2": 15},
]  # fmt: skip


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


#: the tiny BERT of these tests: positions for 64 tokens, eager attention
BERT = {"max_position_embeddings": 64, "attn_implementation": "eager"}


def _tiny_bert(num_labels: int = 2):
    return tiny_bert_config(VOCAB, num_labels, **BERT)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("superglue")
    model = tiny_bert(tmp / "bert", vocab=VOCAB, **BERT)
    tok = transformers.BertTokenizerFast.from_pretrained(model)
    _jsonl(tmp / "RTE" / "train.jsonl", RTE)
    val = [
        {"premise": "the cat ran.", "hypothesis": "the cat did run.", "label": "entailment", "idx": 0},
        {"premise": "a dog sat.", "hypothesis": "a dog ran fast.", "label": "not_entailment", "idx": 1},
        {"premise": "it was the money.", "hypothesis": "it was money.", "label": "entailment", "idx": 2},
        {
            "premise": "the word was slow.",
            "hypothesis": "the word was fast.",
            "label": "not_entailment",
            "idx": 3,
        },
    ]
    _jsonl(tmp / "RTE" / "val.jsonl", val)
    _jsonl(tmp / "RTE" / "test.jsonl", [{k: v for k, v in r.items() if k != "label"} for r in RTE[:2]])
    _jsonl(tmp / "BoolQ" / "val.jsonl", BOOLQ)
    _jsonl(tmp / "wic" / "train.jsonl", WIC)
    return {"root": tmp, "model": model, "tok": tok}


def _hand(*words: str) -> list[int]:
    return [ID[w] for w in words]


def test_rte_ids_equal_the_tokenizers_encoding_and_a_hand_count(files):
    x, y = load_dataset(f"rte:{files['root'] / 'RTE'}", "train", tokenizer=str(files["model"]), max_length=16)
    assert x.dtype == torch.int64 and x.shape == (6, 3, 16)
    assert y.tolist() == [0, 1, 1, 0, 0, 1]  # entailment 0, not_entailment 1 (super_glue's ClassLabel)
    tok = files["tok"]
    for i, r in enumerate(RTE):
        ref = tok(r["premise"], r["hypothesis"], padding="max_length", truncation=True, max_length=16)
        assert x[i, 0].tolist() == ref["input_ids"]
        assert x[i, 1].tolist() == ref["attention_mask"]
        assert x[i, 2].tolist() == ref["token_type_ids"]
    # example 0 by hand: [CLS] the cat sat on a mat . [SEP] the cat sat . [SEP], then 2 [PAD]
    a = _hand("the", "cat", "sat", "on", "a", "mat", ".")
    b = _hand("the", "cat", "sat", ".")
    assert x[0, 0].tolist() == [ID["[CLS]"], *a, ID["[SEP]"], *b, ID["[SEP]"], 0, 0]
    assert x[0, 1].tolist() == [1] * 14 + [0, 0]
    assert x[0, 2].tolist() == [0] * 9 + [1] * 5 + [0, 0]
    # the parent directory with SuperGLUE's RTE folder finds the same files; limit keeps the first
    x2, y2 = load_superglue("rte", files["root"], "train", tokenizer=files["model"], max_length=16, limit=2)
    assert torch.equal(x2, x[:2]) and torch.equal(y2, y[:2])
    # precision = "float64" asks every loader for dtype=float64: token ids stay int64
    x3, _ = load_superglue("rte", files["root"], tokenizer=files["model"], max_length=16, dtype=torch.float64)
    assert x3.dtype == torch.int64 and torch.equal(x3, x)


def test_boolq_truncates_the_passage_and_wic_puts_the_word_first(files):
    x, y = load_superglue("boolq", files["root"], "validation", tokenizer=files["model"], max_length=16)
    assert y.tolist() == [1, 0]  # true 1, false 0
    q = _hand("is", "the", "cat", "on", "a", "mat")
    p = _hand("the", "cat", "sat", "on", "a", "mat", ".")
    # 16 tokens: [CLS] + 6 question + [SEP] + 7 of the 42 passage tokens + [SEP]: longest_first
    # (the Rust tokenizer's: the shorter segment keeps its 6 < 13 / 2 tokens) cut only the passage
    assert x[0, 0].tolist() == [ID["[CLS]"], *q, ID["[SEP]"], *p, ID["[SEP]"]]
    assert x[0, 1].tolist() == [1] * 16
    assert x[0, 2].tolist() == [0] * 8 + [1] * 8
    x, y = load_superglue("wic", files["root"], "train", tokenizer=files["model"], max_length=16)
    assert y.tolist() == [0, 1]
    ref = files["tok"](
        [f"{r['word']}: {r['sentence1']}" for r in WIC], [r["sentence2"] for r in WIC],
        padding="max_length", truncation=True, max_length=16,
    )  # fmt: skip
    assert x[:, 0].tolist() == ref["input_ids"] and x[:, 2].tolist() == ref["token_type_ids"]
    assert x[0, 0, :8].tolist() == [
        ID["[CLS]"],
        *_hand("bank", ":", "the", "river", "bank", "."),
        ID["[SEP]"],
    ]


def test_data_errors_name_the_problem(files, tmp_path, monkeypatch):
    root, model = files["root"], str(files["model"])
    with pytest.raises(ValueError, match="SuperGLUE hides the test labels: use split 'val'"):
        load_superglue("rte", root, "test", tokenizer=model)
    with pytest.raises(FileNotFoundError, match="val.jsonl not found"):
        load_superglue("wic", root, "val", tokenizer=model)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_superglue("rte", tmp_path / "nowhere", "train", tokenizer=model)
    monkeypatch.delenv(TEXT_MODEL_ENV, raising=False)
    with pytest.raises(ValueError, match=f"needs a tokenizer.*{TEXT_MODEL_ENV}"):
        load_superglue("rte", root, "train")
    monkeypatch.setenv(TEXT_MODEL_ENV, model)  # the default tokenizer directory
    assert torch.equal(
        load_superglue("rte", root, "train")[0], load_superglue("rte", root, tokenizer=model)[0]
    )
    with pytest.raises(FileNotFoundError, match="tokenizer directory .* does not exist"):
        load_superglue("rte", root, "train", tokenizer=str(tmp_path / "no_tok"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no tokenizer"):
        load_superglue("rte", root, "train", tokenizer=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="split must be one of"):
        load_superglue("rte", root, "dev2", tokenizer=model)
    with pytest.raises(ValueError, match="max_length must be an int >= 8"):
        load_superglue("rte", root, "train", tokenizer=model, max_length=4)
    bad = tmp_path / "bad"
    _jsonl(bad / "train.jsonl", [{**RTE[0], "label": "contradiction"}])
    with pytest.raises(ValueError, match="example 1: label must be 'entailment' or 'not_entailment'"):
        load_superglue("rte", bad, "train", tokenizer=model)
    _jsonl(bad / "train.jsonl", [{**WIC[0], "end1": 99}])
    with pytest.raises(ValueError, match="not a character span of sentence1"):
        load_superglue("wic", bad, "train", tokenizer=model)
    (bad / "train.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="line 1: not a JSON object"):
        load_superglue("boolq", bad, "train", tokenizer=model)
    with pytest.raises(ValueError, match="unknown data spec"):
        load_dataset("copa:" + str(root))


def test_wrapper_logits_equal_the_transformers_model_and_dropout_follows_the_mode(files):
    x, _ = load_superglue("rte", files["root"], "train", tokenizer=files["model"], max_length=16)
    wrapper = model_factory("hf-classifier", seed=0, path=str(files["model"]))
    assert wrapper.zoo_config == {"name": "hf-classifier", "seed": 0, "path": str(files["model"])}
    ref = transformers.BertForSequenceClassification.from_pretrained(
        files["model"], attn_implementation="eager"
    )
    assert wrapper.training and all(m.training for m in wrapper.modules())  # built in training mode
    wrapper.eval()
    ref.eval()
    assert not any(m.training for m in wrapper.modules())
    with torch.no_grad():
        got = wrapper(x)
        want = ref(input_ids=x[:, 0], attention_mask=x[:, 1], token_type_ids=x[:, 2]).logits
    assert got.shape == (6, 2) and torch.equal(got, want)
    # training mode: BERT's dropout acts (two passes differ), the same seed repeats a pass
    wrapper.train()
    with torch.no_grad():
        torch.manual_seed(1)
        a = wrapper(x)
        b = wrapper(x)
        torch.manual_seed(1)
        c = wrapper(x)
    assert not torch.equal(a, b) and torch.equal(a, c)
    with pytest.raises(TypeError, match="takes integer token ids"):
        wrapper(x.float())
    with pytest.raises(ValueError, match=r"inputs \[N, 3, L\]"):
        wrapper(x[:, 0])


def test_new_head_is_seeded_and_the_encoder_is_the_checkpoints(files, tmp_path):
    from safetensors.torch import load_file

    enc = tmp_path / "encoder"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        transformers.BertModel(_tiny_bert()).save_pretrained(enc, safe_serialization=True)
    a = model_factory("hf-classifier", seed=3, path=enc, num_classes=3)
    b = model_factory("hf-classifier", seed=3, path=enc, num_classes=3)
    c = model_factory("hf-classifier", seed=4, path=enc, num_classes=3)
    head = "model.classifier.weight"
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa[head].shape == (3, 8)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # same seed: same head
    assert not torch.equal(sa[head], sc[head])
    saved = load_file(enc / "model.safetensors")
    for k, v in saved.items():  # the encoder is the file's, whatever the seed
        key = "model.bert." + k.removeprefix("bert.")
        assert torch.equal(sa[key], v) and torch.equal(sc[key], v), k
    # the meta build (the runner's shape check) has the same parameters, counted without weights
    meta = model_factory("hf-classifier", device="meta", path=enc, num_classes=3)
    assert next(meta.parameters()).is_meta
    assert count_parameters(meta) == count_parameters(a) == sum(v.numel() for v in saved.values()) + 3 * 8 + 3


def test_model_errors(files, tmp_path, monkeypatch):
    binonly = tmp_path / "bin"
    transformers.BertForSequenceClassification(_tiny_bert()).save_pretrained(
        binonly, safe_serialization=False
    )
    assert (binonly / "pytorch_model.bin").is_file() and not list(binonly.glob("*.safetensors"))
    with pytest.raises(ValueError, match=r"only pytorch_model.bin \(pickle files\).*safe_serialization=True"):
        model_factory("hf-classifier", path=binonly)
    (tmp_path / "noconfig").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        model_factory("hf-classifier", path=tmp_path / "noconfig")
    with pytest.raises(FileNotFoundError, match="does not exist; nothing is downloaded"):
        model_factory("hf-classifier", path=tmp_path / "missing")
    with pytest.raises(TypeError, match="path"):
        model_factory("hf-classifier")
    with pytest.raises(ValueError, match="num_classes must be an int >= 2"):
        model_factory("hf-classifier", path=files["model"], num_classes=1)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(ImportError, match="pip install transformers --no-deps"):
        model_factory("hf-classifier", path=files["model"])
    with pytest.raises(ImportError, match="pip install transformers --no-deps"):
        load_superglue("rte", files["root"], tokenizer=files["model"])


@pytest.mark.slow  # a fresh interpreter importing torch: seconds on a loaded machine
def test_importing_the_packages_does_not_import_transformers():
    code = (
        "import sys, landscape.models, landscape.data, experiments.data; print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


RUN = """
name = "tiny_rte"
seeds = [0]
device = "cpu"
threads = 1
progress = false
[data]
name = "rte:{rte}"
kwargs = {{ tokenizer = "{model}", max_length = 16 }}
test_split = "val"
[model]
name = "hf-classifier"
kwargs = {{ path = "{model}" }}
[train]
epochs = 1
batch_size = 2
lr = 1e-3
schedule = "constant"
[[methods]]
name = "adam"
optimizer = "adam"
[[methods]]
name = "sam"
optimizer = "sam"
hyperparameters = {{ rho = 0.05, base_optimizer = "adam" }}
[evaluation]
every = 1
"""


@pytest.mark.usefixtures("one_thread")
def test_adam_and_sam_run_end_to_end_and_metrics_equal_the_saved_model(files, tmp_path):
    from experiments.cli import main

    cfg = tmp_path / "rte.toml"
    cfg.write_text(RUN.format(rte=files["root"] / "RTE", model=files["model"]))
    assert main(["run", str(cfg), f"out_dir={tmp_path / 'runs'}"]) == 0
    x, y = load_superglue("rte", files["root"], "val", tokenizer=files["model"], max_length=16)
    start = model_factory("hf-classifier", seed=0, path=str(files["model"])).state_dict()
    for method in ("adam", "sam"):
        run = tmp_path / "runs" / "tiny_rte" / method / "seed0"
        saved = torch.load(run / "checkpoint.pt", weights_only=True)
        assert saved["counters"]["step"] == 3  # 6 training examples, batch size 2, one epoch
        assert any(not torch.equal(saved["model"][k], start[k]) for k in start)  # it trained
        model = model_factory("hf-classifier", seed=0, path=str(files["model"]))
        model.load_state_dict(saved["model"])
        model.eval()
        with torch.no_grad():
            logits = model(x).double()
        metrics = json.loads((run / "metrics.json").read_text())
        acc = float((logits.argmax(1) == y).double().mean())
        nll = float(torch.nn.functional.cross_entropy(logits, y))
        assert metrics["accuracy"] == pytest.approx(acc, abs=1e-12)
        assert metrics["nll"] == pytest.approx(nll, rel=1e-6) and math.isfinite(metrics["nll"])
