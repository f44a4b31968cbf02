"""Chinese that is good survives the FineWeb recipe; junk is dropped, each by a named rule.

Written for this test: modern prose, classical prose (the opening of the Analects), a Cantonese passage,
and three kinds of junk. On real material (5,671 poems) nothing Chinese was kept: jieba's punctuation tokens
counted as non-alphabetic words (gopher_quality.min_alpha_words_ratio dropped classical text), and
classical or Cantonese text was labelled wuu or yue.
"""

import datetime

import pyarrow as pa
import pytest

from pipeline.clean.job import clean_documents
from pipeline.core.spark import spark_schema, spark_session
from pipeline.documents.extract import EXTRACTED_SCHEMA
from tests.conftest import make_config

pytestmark = pytest.mark.slow

MODERN = "\n".join(
    [
        "茶起源于中国，已有数千年的历史。最初，人们把茶叶当作药材，用来提神和解渴。",
        "后来，喝茶逐渐成为日常生活的一部分，并传播到世界各地，成为很多国家的传统。",
        "不同地区的茶有不同的风味。绿茶清新，红茶浓郁，乌龙茶介于两者之间，各有特色。",
        "泡茶时，水温和时间都很重要，过热的水会让绿茶变苦，而太凉的水又泡不出香味。",
        "今天，很多人仍然喜欢在安静的午后泡一壶茶，和朋友聊天，或者一个人慢慢品味。",
    ]
)
CLASSICAL = "\n".join(
    [
        "子曰：学而时习之，不亦说乎？有朋自远方来，不亦乐乎？人不知而不愠，不亦君子乎？",
        "有子曰：其为人也孝弟，而好犯上者，鲜矣；不好犯上，而好作乱者，未之有也。君子务本，本立而道生。",
        "曾子曰：吾日三省吾身：为人谋而不忠乎？与朋友交而不信乎？传不习乎？",
        "子曰：道千乘之国，敬事而信，节用而爱人，使民以时。",
        "子曰：弟子入则孝，出则弟，谨而信，泛爱众，而亲仁。行有余力，则以学文。",
        "子夏曰：贤贤易色；事父母，能竭其力；事君，能致其身；与朋友交，言而有信。虽曰未学，吾必谓之学矣。",
    ]
)
CANTONESE = "\n".join(
    [
        "佢哋今日朝早去咗街市買餸，買咗好多新鮮嘅魚同埋菜，準備晚黑煮一餐豐富嘅晚飯。",
        "阿媽話天氣凍咗，叫我哋出街嗰陣要著多件衫，唔好冷親，仲要記得帶遮。",
        "我哋喺茶樓飲茶，叫咗蝦餃、燒賣同叉燒包，大家傾偈傾到好夜先至返屋企。",
        "香港嘅夜景好靚，好多遊客都會搭纜車上山頂，睇住成個維多利亞港嘅燈光。",
        "返到屋企之後，細佬仲要做功課，佢話聽日要考試，所以今晚要早啲瞓覺。",
    ]
)
SPAM = "\n".join(["免费下载最新电影，点击这里立即观看高清完整版！"] * 12)
PRICES = "\n".join(f"【特价】商品{i}号 ￥{i * 7}元 ★★★★☆ 包邮 现货 秒杀" for i in range(12))
MENU = "\n".join(
    [
        "首页",
        "新闻",
        "体育",
        "娱乐",
        "财经",
        "科技",
        "汽车",
        "房产",
        "游戏",
        "登录",
        "注册",
        "联系",
        "关于",
        "帮助",
        "地图",
        "招聘",
    ]
)


@pytest.fixture(scope="module")
def decided(tmp_path_factory):
    config = make_config(tmp_path_factory.mktemp("chinese") / "data", "clean.languages=[en, zh]")
    fetched = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
    texts = {
        "modern": MODERN,
        "classical": CLASSICAL,
        "cantonese": CANTONESE,
        "spam": SPAM,
        "prices": PRICES,
        "menu": MENU,
    }
    rows = [
        {"id": name, "url": f"https://zh.example/{name}", "domain": "zh.example", "fetch_time": fetched}
        | {"text": text, "drop_reason": None}
        for name, text in texts.items()
    ]
    spark = spark_session(config, "test-clean-chinese")
    table = pa.Table.from_pylist(rows, schema=EXTRACTED_SCHEMA)
    frame = spark.createDataFrame(table.to_pandas(), schema=spark_schema(EXTRACTED_SCHEMA))
    return {row["id"]: row.asDict(recursive=True) for row in clean_documents(frame, config).collect()}


def test_good_chinese_is_kept(decided):
    for name in ("modern", "classical"):
        assert (decided[name]["lang"], decided[name]["drop_rule"]) == ("zh", None), decided[name][
            "drop_reason"
        ]


def test_cantonese_counts_as_chinese_through_the_language_group(decided):
    """py3langid says yue; clean.language_groups makes zh, wuu and yue one language for the rules."""
    cantonese = decided["cantonese"]
    assert (cantonese["lang"], cantonese["drop_rule"]) == ("zh", None), cantonese["drop_reason"]
    assert cantonese["lang_score"] > 0.99


def test_the_word_rules_count_words_not_jiebas_punctuation_tokens(decided):
    signals = decided["classical"]["signals"]["gopher_quality"]
    assert signals["alpha_words_ratio"] >= 0.99  # every word is alphabetic; "，" and "。" are not words
    assert signals["n_words"] == signals["n_non_symbol_words"]


def test_junk_is_dropped_by_named_rules(decided):
    assert decided["spam"]["drop_rule"] == "gopher_repetition.dup_line_frac"
    assert decided["prices"]["drop_rule"] == "gopher_repetition.top_2_gram_char_frac"
    assert decided["menu"]["drop_rule"] == "normalize.too_short"


def test_a_per_language_score_threshold_replaces_the_global_one(tmp_path):
    config = make_config(
        tmp_path / "data",
        "clean.languages=[en, zh]",
        "clean.language_min_scores={zh: 1.0}",
        "clean.language_groups={}",
    )
    fetched = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
    rows = [
        {"id": "cantonese", "url": "https://zh.example/c", "domain": "zh.example", "fetch_time": fetched}
        | {"text": MODERN, "drop_reason": None}
    ]
    spark = spark_session(config, "test-clean-chinese")
    table = pa.Table.from_pylist(rows, schema=EXTRACTED_SCHEMA)
    frame = spark.createDataFrame(table.to_pandas(), schema=spark_schema(EXTRACTED_SCHEMA))
    (row,) = clean_documents(frame, config).collect()
    assert row["lang"] == "zh" and row["drop_rule"] == "language.min_score"
    assert row["drop_reason"].endswith("< 1.0")
