"""The Spark job on hand-made rows: languages, mojibake, PII, bad input, partition-independence, and the
Spark decision agreeing with the Python rules."""

import datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import trafilatura

from pipeline.clean.filters import first_failing, recipe_rules
from pipeline.clean.job import clean_counters, clean_documents
from pipeline.core.spark import spark_schema, spark_session
from pipeline.documents.extract import EXTRACTED_SCHEMA
from tests.conftest import PROJECT_ROOT, make_config

ARTICLES = PROJECT_ROOT / "pipeline" / "crawl" / "sample_site" / "articles"
CHINESE = "\n".join(
    [
        "茶起源于中国，已有数千年的历史。最初，人们把茶叶当作药材，用来提神和解渴。",
        "后来，喝茶逐渐成为日常生活的一部分，并传播到世界各地，成为很多国家的传统。",
        "不同地区的茶有不同的风味。绿茶清新，红茶浓郁，乌龙茶介于两者之间，各有特色。",
        "泡茶时，水温和时间都很重要，过热的水会让绿茶变苦，而太凉的水又泡不出香味。",
        "今天，很多人仍然喜欢在安静的午后泡一壶茶，和朋友聊天，或者一个人慢慢品味。",
        "这座城市沿着河流发展，河水推动着磨坊的水轮，面包师和酿酒师也在附近定居下来。",
    ]
)
MOJIBAKE_LINE = "The Mona Lisa doesn’t have eyebrows, and nobody is sure why — it’s a mystery."
CONTACT_LINE = "Write to anna.smith@example.com or call +1 415 555 2671; the server 192.168.1.20 answered."
TWENTY_MB = 20 * 1024 * 1024


def article(name: str) -> str:
    return trafilatura.extract((ARTICLES / f"{name}.html").read_text(), favor_precision=True)


def rows() -> list[dict]:
    fetched = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
    texts = {
        "article": article("river-mills"),
        "mojibake": MOJIBAKE_LINE.encode("utf-8").decode("cp1252") + "\n" + article("sourdough"),
        "pii": article("night-sky") + "\n" + CONTACT_LINE + " Also fe80::1ff:fe23:4567:890a replied.",
        "chinese": CHINESE,
        "mixed": article("compost").split("\n", 2)[1] + "\n" + CHINESE,
        "uncertain": "Before steam engines and electric motors, a river was the most reliable source of power a "
        "village could hope for.\n"
        + "茶起源于中国，已有数千年的历史。最初，人们把茶叶当作药材，用来提神和解渴。"
        * 2,
        "german": "Die Stadt liegt an einem breiten Fluss, der seit Jahrhunderten die Mühlen antreibt. " * 3,
        "empty": "",
        "missing": None,
        "junk": bytes(range(256)).decode("latin-1") * 4,
        "repetitive": "\n".join(["Buy cheap shoes online today."] * 30),
        "huge": "a" * TWENTY_MB,
    }
    return [
        {
            "id": name,
            "url": f"https://example.org/{name}",
            "domain": "example.org",
            "fetch_time": fetched,
            "text": text,
            "drop_reason": "no_main_text" if name == "missing" else None,
        }
        for name, text in texts.items()
    ]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The rows as Parquet, plus one row whose bytes are not valid UTF-8 (CESU-8 surrogates, stray bytes)."""
    folder = tmp_path_factory.mktemp("clean-job")
    table = pa.Table.from_pylist(rows(), schema=EXTRACTED_SCHEMA)
    pq.write_table(table, folder / "valid.parquet")
    invalid = "An encoded surrogate \xed\xa0\x80 and a stray \xff byte sit in this line.\n".encode("latin-1")
    binary = pa.array([invalid + article("tide-pools").encode("utf-8")], pa.binary())
    text = pa.Array.from_buffers(pa.string(), 1, binary.buffers())  # no UTF-8 validation
    broken = pa.Table.from_pylist([{**rows()[0], "id": "surrogates", "text": None}], schema=EXTRACTED_SCHEMA)
    broken = broken.set_column(broken.schema.get_field_index("text"), "text", text)
    pq.write_table(broken, folder / "broken.parquet")
    return folder


def run_clean(corpus_folder, partitions: int, *overrides):
    config = make_config(corpus_folder / "data", "clean.languages=[en, zh]", *overrides)
    spark = spark_session(config, "test-clean-job")
    extracted = spark.read.schema(spark_schema(EXTRACTED_SCHEMA)).parquet(str(corpus_folder / "*.parquet"))
    decided = clean_documents(extracted.repartition(partitions), config)
    return (
        config,
        {row["id"]: row.asDict(recursive=True) for row in decided.collect()},
        clean_counters(decided),
    )


@pytest.fixture(scope="module")
def cleaned(corpus):
    return run_clean(corpus, 3)


@pytest.mark.slow
def test_languages_and_their_rules(cleaned):
    _, out, counters = cleaned
    assert out["article"]["drop_rule"] is None and out["article"]["lang"] == "en"
    chinese = out["chinese"]
    assert (chinese["lang"], chinese["drop_rule"]) == ("zh", None), chinese["drop_reason"]
    assert chinese["signals"]["gopher_quality"]["n_stop_words"] is None, "no stop-word rule for Chinese"
    assert chinese["signals"]["c4"]["sentences"] >= 5, "full-width full stops end Chinese sentences"
    assert out["german"]["lang"] == "de" and out["german"]["drop_rule"] == "language.not_kept"
    mixed = out["mixed"]
    assert mixed["lang"] in {"en", "zh"} and mixed["lang_score"] is not None
    # py3langid splits this text between zh (0.62) and wuu/yue; clean.language_groups makes them one language.
    uncertain = out["uncertain"]
    assert uncertain["lang"] == "zh" and uncertain["lang_score"] > 0.99
    assert uncertain["drop_rule"] != "language.min_score"
    kept_as_chinese = [
        n for n in ("chinese", "mixed", "uncertain") if out[n]["lang"] == "zh" and not out[n]["drop_rule"]
    ]
    assert counters["kept_by_language"]["zh"] == len(kept_as_chinese)


@pytest.mark.slow
def test_mojibake_is_repaired(cleaned):
    _, out, _ = cleaned
    text = out["mojibake"]["text"]
    assert MOJIBAKE_LINE in text and "â€" not in text
    assert out["mojibake"]["drop_rule"] is None


@pytest.mark.slow
def test_pii_is_redacted_and_counted(cleaned):
    _, out, counters = cleaned
    row = out["pii"]
    assert row["drop_rule"] is None, row["drop_reason"]
    assert "anna.smith@example.com" not in row["text"] and "<EMAIL>" in row["text"]
    assert "<PHONE_NUMBER>" in row["text"] and "<IP_ADDRESS>" in row["text"]
    assert row["pii"] == {"email": 1, "ip": 2, "phone": 1}
    assert counters["pii_redacted"] == {"email": 1, "ip": 2, "phone": 1}


@pytest.mark.slow
def test_bad_rows_are_quarantined_with_a_reason(cleaned):
    _, out, counters = cleaned
    assert out["missing"]["drop_rule"] == "extract.no_main_text"
    assert out["empty"]["drop_rule"] == "normalize.too_short"
    assert out["huge"]["drop_rule"] == "input.too_long" and out["huge"]["n_chars"] == TWENTY_MB
    assert out["junk"]["drop_rule"] is not None and out["junk"]["drop_reason"]
    repetitive = out["repetitive"]
    assert repetitive["drop_rule"].startswith("gopher_repetition.")
    signal = repetitive["drop_reason"].split(": ", 1)[1].split("=")[0]
    value = repetitive["signals"]["gopher_repetition"][signal]
    assert repetitive["drop_reason"] == f"{repetitive['drop_rule']}: {signal}={value} > 0.3"
    surrogates = out["surrogates"]
    assert "\ufffd" in surrogates["text"] and "tide" in surrogates["text"].lower()
    assert surrogates["text"].encode("utf-8"), "valid UTF-8 after the pass"
    assert counters["input_pages"] == len(out)
    assert sum(counters["dropped"].values()) == sum(row["drop_rule"] is not None for row in out.values())
    chars_by_rule = {}
    for row in out.values():
        if row["drop_rule"] is not None:
            chars_by_rule[row["drop_rule"]] = chars_by_rule.get(row["drop_rule"], 0) + len(row["text"] or "")
    assert counters["dropped_chars"] == dict(sorted(chars_by_rule.items()))
    assert counters["kept_chars"] == sum(len(r["text"]) for r in out.values() if r["drop_rule"] is None)
    assert counters["input_chars"] == counters["kept_chars"] + sum(chars_by_rule.values())


@pytest.mark.slow
def test_spark_decision_matches_the_python_rules(cleaned):
    config, out, _ = cleaned
    rules = recipe_rules(config.clean, sorted(config.clean.language_overrides))
    checked = 0
    for row in out.values():
        if row["signals"] is None:
            continue
        expected = first_failing(rules, row["signals"], row["lang"])
        assert row["drop_rule"] == (expected.name if expected else None), row["id"]
        checked += 1
    assert checked >= 5


@pytest.mark.slow
def test_result_does_not_depend_on_partitioning(corpus, cleaned):
    _, one_partition, _ = run_clean(corpus, 1)
    assert one_partition == cleaned[1]


@pytest.mark.slow
def test_spark_redaction_matches_python(corpus):
    from pipeline.clean.pii import KINDS, redact, redact_dataframe
    from tests.clean.test_pii import PLACEHOLDERS, SAMPLES

    config = make_config(corpus / "data")
    spark = spark_session(config, "test-clean-job")
    texts = [text for text, *_ in SAMPLES] + [
        "no pii here",
        None,
        "mixed a@b.io and 10.0.0.1 and +1 415 555 2671",
    ]
    df = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "id int, text string")
    out = {row["id"]: row for row in redact_dataframe(df, PLACEHOLDERS).collect()}
    for i, text in enumerate(texts):
        if text is None:
            assert out[i]["text"] is None and out[i]["pii"].asDict() == dict.fromkeys(KINDS, 0)
            continue
        expected_text, expected_counts = redact(text, PLACEHOLDERS)
        assert (out[i]["text"], out[i]["pii"].asDict()) == (expected_text, expected_counts), text


@pytest.mark.slow
def test_each_rules_sql_matches_its_python_rule_on_random_signals(tmp_path):
    """Every recipe rule's SQL condition and reason against ``Rule.drops`` on 600 random rows: signals at,
    just above and below, and far from each threshold, zero, or missing; languages with and without
    overrides, and none. An independent check of the SQL text (quoting, per-language CASE, null handling)."""
    import random
    import re

    from pyspark.sql import functions as F

    from pipeline.clean.filters import SIGNALS

    config = make_config(tmp_path, "clean.languages=[en, zh]")
    rules = recipe_rules(config.clean, sorted(config.clean.language_overrides))
    languages = [None, "en", "zh", "de", *sorted(config.clean.language_overrides)]
    thresholds: dict[str, set] = {}
    for rule in rules:
        thresholds.setdefault(rule.signal, set()).update(v for v in rule.thresholds.values() if v is not None)
    rng = random.Random(20261201)

    def value_for(signal: str, arrow_type):
        near = sorted(thresholds.get(signal, {1}), key=repr)
        if pa.types.is_string(arrow_type):
            return rng.choice([None, "", *near])
        choice = rng.choice(["none", "zero", "at", "above", "below", "far"])
        base = rng.choice(near)
        if choice == "none":
            return None
        step = 1 if pa.types.is_integer(arrow_type) else abs(base) * 0.01 + 1e-9
        value = {"zero": 0, "at": base, "above": base + step, "below": base - step,
                 "far": rng.uniform(0, 3 * base + 1)}[choice]  # fmt: skip
        return round(value) if pa.types.is_integer(arrow_type) else float(value)

    rows = []
    for _ in range(600):
        signals = {
            group.name: {
                field.name: value_for(f"{group.name}.{field.name}", field.type) for field in group.type
            }
            for group in SIGNALS
        }
        rows.append({"lang": rng.choice(languages), "signals": signals})
    table = pa.Table.from_pylist(rows, schema=pa.schema([("lang", pa.string()), ("signals", SIGNALS)]))
    spark = spark_session(config, "test-clean-job")
    df = spark.createDataFrame(table.to_pandas(), schema=spark_schema(table.schema))
    columns = []
    for i, rule in enumerate(rules):
        columns += [F.expr(rule.sql_condition()).alias(f"c{i}"), F.expr(rule.sql_reason()).alias(f"r{i}")]
    out = df.select("lang", "signals", *columns).collect()
    assert len(out) == len(rows)
    drops = 0
    for row in out:
        signals = row["signals"].asDict(recursive=True)
        for i, rule in enumerate(rules):
            expected = rule.drops(signals, row["lang"])
            assert bool(row[f"c{i}"]) == expected, (rule.name, row["lang"], signals)
            if not expected:
                continue
            drops += 1
            signal = rule.signal.split(".")[1]
            match = re.fullmatch(
                rf"{re.escape(rule.name)}: {signal}=(.+) {re.escape(rule.op)} (.+)", row[f"r{i}"]
            )
            assert match, row[f"r{i}"]
            value = signals[rule.signal.split(".")[0]][signal]
            assert (match[1] == value) if isinstance(value, str) else float(match[1]) == value
            assert match[2] == repr(rule.threshold(row["lang"]))
    assert drops > 300
