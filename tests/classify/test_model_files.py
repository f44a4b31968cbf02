"""A fastText model file is checked whole in the driver before any worker loads it (issue 46): cut short, grown,
or with a size field overwritten, it is one error naming the file; with `sha256:` any changed byte is. No Spark
here: the classify stage refuses the file before it starts one."""

from __future__ import annotations

import dataclasses
import hashlib
import random
import shutil
import struct

import fasttext
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.classify.__main__ import main as classify_main
from pipeline.classify.models import FastTextFile, check_fasttext_file, resolve, score_texts
from pipeline.classify.preprocess import dclm
from pipeline.config import load_config
from pipeline.core.cli import run_cli
from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef, StageOutput
from tests.classify.corpus import document, publish_documents
from tests.conftest import make_config

LABELS = ("hq", "cc", "other")


def train(folder, **params):
    rng = random.Random(0)
    lines = [
        f"__label__{label} " + " ".join(f"{label}{rng.randrange(50)}" for _ in range(12))
        for label in LABELS * 100
    ]
    (folder / "train.txt").write_text("\n".join(lines) + "\n")
    # fastText 0.9.x gives NaN on tiny inputs unless dim is a multiple of 10 with 10 threads (config.py).
    return fasttext.train_supervised(
        str(folder / "train.txt"), thread=10, verbose=0, epoch=3, dim=10, wordNgrams=2, **params
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A dense model (bucket 20, 7 kB) and a quantized one (.ftz: at least 256 input rows to quantize)."""
    folder = tmp_path_factory.mktemp("models")
    dense = train(folder, bucket=20)
    dense.save_model(str(folder / "model.bin"))
    quantized = train(folder, bucket=300)
    quantized.quantize(input=str(folder / "train.txt"), qnorm=True, cutoff=260, retrain=False)
    quantized.save_model(str(folder / "model.ftz"))
    return {"dense": (folder / "model.bin", dense), "quantized": (folder / "model.ftz", quantized)}


def structural_offsets(data: bytes) -> tuple[list[int], int]:
    """The byte offsets of a dense supervised model whose every change moves the layout (an independent walk
    of fastText's format): magic, dim, model kind, bucket, the dictionary's counts and pruned-index size, each
    entry's NUL and type byte, the quantized flag, and both matrices' rows and columns; and where the input
    matrix's values start."""
    offsets = [*range(0, 4), *range(8, 12), *range(36, 44), *range(64, 76), *range(84, 92)]
    (size,) = struct.unpack_from("<i", data, 64)
    at = 92
    for _ in range(size):
        nul = data.index(b"\0", at)
        offsets += [nul, nul + 9]
        at = nul + 10
    offsets += [at, *range(at + 1, at + 17)]  # quantized flag, input rows and cols
    rows, cols = struct.unpack_from("<qq", data, at + 1)
    output = at + 17 + rows * cols * 4 + 1  # after the qout flag, which a dense model's loader ignores
    return offsets + list(range(output, output + 16)), at + 17


def layout(checked: FastTextFile) -> FastTextFile:
    """What a check found, but the labels' text (a label renamed keeps the layout; `label:` catches it)."""
    return dataclasses.replace(checked, labels=tuple(str(i) for i in range(len(checked.labels))))


def scoring_config(root, path, *extra):
    return load_config(
        None,
        [f"project.data_root={root}", f"classify.models=[{{name: q, path: {path}{''.join(extra)}}}]"],
        environ={},
    )


# --- the reported breaks ---------------------------------------------------------------------------


def damaged(data: bytes, how: str) -> bytes:
    if how == "half":
        return data[: len(data) // 2]
    if how == "missing the last 10 bytes":
        return data[:-10]
    if how == "dim 2^30 in the header":
        return data[:8] + struct.pack("<i", 1 << 30) + data[12:]
    assert how == "64 bytes"
    return data[:64]


BREAKS = {
    "half": "the input matrix (171 x 10 float32) needs",
    "missing the last 10 bytes": "the output matrix (3 x 10 float32) needs 120 bytes",
    "dim 2^30 in the header": "the input matrix is 171 x 10, the header and dictionary say 171 x 1073741824",
    "64 bytes": "the dictionary's header needs 28 bytes from byte 64, the file ends at byte 64",
}


@pytest.mark.parametrize("how", list(BREAKS))
def test_each_reported_break_is_refused_by_the_check(models, tmp_path, how):
    path, _ = models["dense"]
    bad = tmp_path / "model.bin"
    bad.write_bytes(damaged(path.read_bytes(), how))
    with pytest.raises(ConfigError) as refused:
        check_fasttext_file(bad)
    assert str(refused.value).startswith(f"{bad} is not a whole fastText model: ")
    assert BREAKS[how] in str(refused.value)


@pytest.mark.parametrize("how", list(BREAKS))
def test_the_classify_stage_refuses_a_damaged_model_with_one_error_line(models, tmp_path, capsys, how):
    """Before: a half file dropped every document at threshold 0.5 (exit 0, published), 64 bytes was a
    traceback. Now exit 2, one `error:` line naming the model and the file, nothing published, no Spark."""
    path, _ = models["dense"]
    bad = tmp_path / "model.bin"
    bad.write_bytes(damaged(path.read_bytes(), how))
    root = tmp_path / "data"
    publish_documents(make_config(root), "dedup", "s1", [document(f"hq{i} hq{i + 1} hq3") for i in range(8)])
    argv = ["--snapshot", "s1"]
    for item in (
        f"project.data_root={root}",
        "logging.console=false",
        "tracking.stage_runs=false",
        f"classify.models=[{{name: q, path: {bad}, label: __label__hq, threshold: 0.5}}]",
    ):
        argv += ["--set", item]
    code = run_cli(classify_main, argv)
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0] and "Traceback" not in err, err[-3000:]
    assert errors[0].startswith(f"error: classify.models[q]: {bad} is not a whole fastText model: ")
    assert BREAKS[how] in errors[0]
    assert not DatasetRef.of(make_config(root), "classify", "s1").path.exists()


# --- properties over damaged copies -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dense", "quantized"])
def test_intact_models_pass_the_check_with_the_shapes_fasttext_reports(models, kind):
    path, model = models[kind]
    checked = check_fasttext_file(path)
    assert sorted(checked.labels) == sorted(model.labels)
    assert checked.dim == 10 and checked.output_rows == 3 and checked.quantized == (kind == "quantized")
    assert checked.size == path.stat().st_size
    assert checked.input_rows == (len(model.words) + 20 if kind == "dense" else 260)  # cutoff prunes to 260


@pytest.mark.parametrize("kind", ["dense", "quantized"])
@settings(max_examples=60)
@given(cut=st.floats(0, 1, exclude_max=True), grown=st.binary(max_size=3))
def test_every_truncation_or_appended_tail_is_refused(models, tmp_path_factory, kind, cut, grown):
    path, _ = models[kind]
    data = path.read_bytes()
    bad = tmp_path_factory.mktemp("cut") / path.name
    bad.write_bytes(data[: int(cut * len(data))] if not grown else data + grown)
    with pytest.raises(ConfigError, match=r"is not a (whole )?fastText model"):
        check_fasttext_file(bad)


@pytest.fixture(scope="module")
def flips(models, tmp_path_factory):
    """The dense model, its check, its structural offsets, and a config that names it by digest."""
    path, _ = models["dense"]
    data = path.read_bytes()
    folder = tmp_path_factory.mktemp("flips")
    bad = folder / "model.bin"
    digest = hashlib.sha256(data).hexdigest()
    pinned = scoring_config(folder, bad, f", label: __label__hq, sha256: '{digest}'")
    structural, header_end = structural_offsets(data)
    return data, check_fasttext_file(path), set(structural), header_end, bad, pinned


@settings(max_examples=150)
@given(st.data())
def test_a_flipped_byte_is_refused_or_leaves_the_layout_and_a_digest_refuses_it(flips, data):
    """Outside the float matrices (the first ~1.4 kB and the matrix headers) a flip is refused, or leaves the
    layout the check reports unchanged (a word's letters, a count, epoch, lr, loss 3 -> 1: fields fastText
    reads but whose every value is well-formed). A flip in a structural field (sizes, kinds, NULs, flags) is
    always refused. Inside the float data only a digest can tell, and with `sha256:` every flip is refused."""
    intact, checked, structural, header_end, bad, pinned = flips
    offset = data.draw(
        st.one_of(
            st.sampled_from(sorted(structural)),
            st.integers(0, header_end - 1),
            st.integers(0, len(intact) - 1),
        ),
        label="offset",
    )
    mask = data.draw(st.integers(1, 255), label="mask")
    flipped = bytearray(intact)
    flipped[offset] ^= mask
    bad.write_bytes(bytes(flipped))
    try:
        found = check_fasttext_file(bad)
    except ConfigError as exc:
        assert str(exc).startswith(f"{bad} is not a "), exc
    else:
        assert offset not in structural, f"a flip at structural byte {offset} passed the check"
        assert layout(found) == layout(checked)
    with pytest.raises(ConfigError, match=r"classify.models\[q\]"):
        resolve(pinned.classify.models[0], pinned)


# --- digests ---------------------------------------------------------------------------------------


def test_a_wrong_sha256_is_refused_naming_the_file_and_both_digests(models, tmp_path):
    path, _ = models["dense"]
    found = hashlib.sha256(path.read_bytes()).hexdigest()
    wrong = "ab" * 32
    config = scoring_config(tmp_path, path, f", label: __label__hq, sha256: '{wrong}'")
    with pytest.raises(ConfigError) as refused:
        resolve(config.classify.models[0], config)
    assert str(refused.value) == f"classify.models[q].sha256: {path} has sha256 {found}, expected {wrong}"
    with pytest.raises(ConfigError, match=r"classify\.models\.0\.sha256"):
        scoring_config(tmp_path, path, ", sha256: abc")


@pytest.mark.parametrize("kind", ["dense", "quantized"])
def test_a_right_sha256_is_accepted_and_the_model_scores_as_fasttext_does(models, tmp_path, kind):
    path, model = models[kind]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    config = scoring_config(tmp_path, path, f", label: __label__cc, sha256: '{digest.upper()}'")
    resolved = resolve(config.classify.models[0], config)
    assert resolved.sha256 == digest
    texts = ["cc1 cc2 cc3", "hq4 hq5", "", "other7\ncc1"]
    for text, score in zip(texts, score_texts(resolved, texts), strict=True):
        labels, probabilities = model.predict(dclm(text), k=-1)
        assert score == float(probabilities[list(labels).index("__label__cc")])


def test_a_trained_model_changed_since_train_classifier_recorded_it_is_refused(models, tmp_path):
    """`trained:` names a folder whose manifest holds the model's digest: a file replaced or edited since
    (here one weight) is refused, though its structure is intact."""
    path, _ = models["dense"]
    config = make_config(tmp_path / "data", "classify.models=[{name: q, trained: m1}]")
    with StageOutput(DatasetRef.of(config, "train_classifier", "m1"), config, []) as out:
        shutil.copy(path, out.path / "model.bin")
        out.commit(extra={"model": {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}})
    model_file = DatasetRef.of(config, "train_classifier", "m1").path / "model.bin"
    assert resolve(config.classify.models[0], config).sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    edited = bytearray(model_file.read_bytes())
    edited[-1] ^= 1  # the last output weight: the check cannot see it, the recorded digest does
    model_file.write_bytes(bytes(edited))
    check_fasttext_file(model_file)
    with pytest.raises(
        ConfigError, match=r"^classify\.models\[q\]: .*model\.bin has sha256 [0-9a-f]{64}, expected"
    ):
        resolve(config.classify.models[0], config)
