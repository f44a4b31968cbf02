"""Subject assignment: accuracy on labelled held-out documents (English and Chinese, none of them a prototype),
and the margin, unassigned bucket, shares, flags and prototype-file checks on synthetic inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from pipeline.core.config import ConfigError
from pipeline.embeddings import EncoderConfig
from pipeline.quality import subjects as subjects_module
from pipeline.quality.subjects import (
    CHAR_NGRAM_TFIDF,
    ENCODER,
    ENCODER_UNCOVERED,
    UNASSIGNED,
    Assignment,
    SubjectConfig,
    assign_by_char_ngrams,
    assign_documents,
    assign_from_scores,
    assign_subjects,
    fallback_languages,
    language_warnings,
    load_prototypes,
    plot_subjects,
    routes,
    subject_coverage,
)

# Written for these tests, in the same web-page styles as the prototypes but on other topics and in other
# words; test_held_out_examples_are_not_prototypes checks that none is a prototype.
HELD_OUT = {
    "science_technology": {
        "en": [
            "Astronomers using the new infrared telescope have detected water vapour in the atmosphere of an exoplanet orbiting a red dwarf 120 light years away. The planet is about twice the size of Earth.",
            "Our review of the flagship phone: the camera sensor is larger this year and low-light photos are noticeably cleaner, but battery life dropped to about a day and a half of mixed use.",
            "CRISPR gene editing lets scientists cut DNA at a precise location using a guide RNA and the Cas9 enzyme. Trials are now testing whether it can correct the mutation behind sickle cell disease.",
            "The study tracked 40,000 adults for ten years and found that people who slept fewer than six hours a night had a 20 percent higher risk of heart disease, even after adjusting for diet and exercise.",
            "Quantum computers store information in qubits, which can be in a superposition of 0 and 1. Keeping them stable is hard: most current machines must be cooled to a fraction of a degree above absolute zero.",
            "Engineers have built a bridge from 3D-printed steel. Sensors embedded in the structure record strain and temperature so researchers can see how the printed metal ages under real traffic.",
        ],
        "zh": [
            "天文学家利用新一代红外望远镜，在距离地球一百二十光年的一颗系外行星大气中探测到了水蒸气，这颗行星的大小约为地球的两倍。",
            "新款旗舰手机评测：今年的主摄传感器尺寸更大，夜景照片的噪点明显减少，但续航有所下降，中度使用大约能坚持一天半。",
            "基因编辑技术通过向导RNA引导Cas9酶在DNA的特定位置进行切割，目前临床试验正在验证它能否修复导致镰状细胞贫血的基因突变。",
            "这项研究对四万名成年人进行了为期十年的跟踪，发现每晚睡眠不足六小时的人患心脏病的风险高出百分之二十。",
            "量子计算机用量子比特存储信息，量子比特可以同时处于0和1的叠加态。要让它们保持稳定非常困难，多数设备需要冷却到接近绝对零度。",
            "科研人员用3D打印的钢材建成了一座人行桥，结构内部嵌入的传感器会实时记录应变和温度，用来研究打印金属在真实荷载下的老化规律。",
        ],
    },
    "literature": {
        "en": [
            "He remembered the orchard as it had been that summer, the apples heavy on the branches and his sister laughing somewhere beyond the hedge, and he wondered whether any of it had really happened the way he told it.",
            "The moon hung over the harbour like a lantern no one had lit, and the boats rocked softly, dreaming of the open sea.",
            "In this haunting debut, a young translator returns to the island where her grandmother vanished. The plot is thin, but the language is luminous and the final chapter will stay with you for days.",
            "Chapter Seven. The carriage stopped at the gates of the estate just as the clock struck midnight. Eleanor pulled her shawl tighter and stepped down into the frozen gravel, alone.",
            "O autumn wind that strips the maple bare, you carry every red and yellow word I meant to say, and scatter them across the silent field.",
            "The poet's late work turns away from politics toward memory and landscape. These eighty poems, many of them sonnets, are collected here for the first time with an introduction by her daughter.",
        ],
        "zh": [
            "他还记得那年夏天的果园，苹果压弯了枝头，妹妹的笑声从篱笆那边传来。可他渐渐分不清，那些往事究竟是真实发生过的，还是他一遍遍讲述时添上去的。",
            "月亮挂在港湾上空，像一盏没人点亮的灯笼，渔船轻轻摇晃着，梦见了远方的大海。",
            "这部令人难忘的处女作讲述一位年轻译者回到祖母失踪的小岛。情节略显单薄，但语言晶莹剔透，最后一章会让你回味许久。",
            "第七章。马车在庄园门口停下时，钟声正好敲了十二下。她裹紧披肩，独自走下车，踩在结了冰的碎石路上。",
            "秋风啊，你吹落了枫树所有的叶子，也带走了我想说却没说出口的话，把它们撒向寂静的田野。",
            "这位诗人晚年的作品远离了政治，转向记忆与山水。本书首次收录她的八十首诗作，并附有其女儿撰写的序言。",
        ],
    },
    "news": {
        "en": [
            "Police arrested three men on Wednesday in connection with a string of burglaries in the northern suburbs, a spokesperson said. The suspects are due to appear in court on Friday.",
            "Thousands of workers walked off the job on Monday as the national rail strike entered its second week, leaving commuters stranded and stations closed across the country.",
            "The government confirmed on Thursday that unemployment fell to 4.1 percent in the third quarter, its lowest level since 2008, though wage growth remained sluggish.",
            "Flooding forced the evacuation of more than 10,000 residents along the river after two days of torrential rain, local authorities said late Saturday. Schools will remain closed on Monday.",
            "The two leaders met for the first time in five years at the summit in Geneva, agreeing to resume talks on trade and border security, according to a joint statement released afterwards.",
            "The veteran striker has announced he will retire at the end of the season after 18 years as a professional. He scored 312 goals for five clubs and won two league titles.",
        ],
        "zh": [
            "警方发言人周三通报，三名男子因涉嫌在城北郊区连续入室盗窃被刑事拘留，案件正在进一步审理中。",
            "全国铁路罢工周一进入第二周，数千名员工停工，全国多地车站关闭，大量通勤乘客滞留。",
            "政府周四公布的数据显示，第三季度失业率降至百分之四点一，为二零零八年以来最低，但工资增长依然乏力。",
            "据当地政府周六晚间通报，连续两天的强降雨引发洪水，沿河一万多名居民被紧急转移，周一全市中小学继续停课。",
            "两国领导人在日内瓦峰会上举行了五年来的首次会晤，会后发表的联合声明称，双方同意恢复贸易和边境安全谈判。",
            "这位老将宣布将在本赛季结束后退役，结束长达十八年的职业生涯。他曾效力五家俱乐部，共打进三百一十二球，两度夺得联赛冠军。",
        ],
    },
    "code": {
        "en": [
            'for (int i = 0; i < n; i++) { if (arr[i] > max) { max = arr[i]; } } printf("%d\\n", max);',
            "Why does my Python script raise KeyError: 'user_id'? I'm reading a JSON response with requests and then doing data['user_id']. Use data.get('user_id') if the key may be missing.",
            "const express = require('express'); const app = express(); app.get('/health', (req, res) => res.json({ status: 'ok' })); app.listen(3000);",
            "git rebase -i HEAD~3 lets you squash the last three commits into one. Mark the commits you want to fold with 's', save the file, then edit the combined commit message.",
            "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, item):\n        self.items.append(item)\n    def pop(self):\n        return self.items.pop()",
            "docker run -d -p 5432:5432 -e POSTGRES_PASSWORD=secret -v pgdata:/var/lib/postgresql/data postgres:16 starts a database container with a named volume so the data survives restarts.",
        ],
        "zh": [
            "用一个 for 循环遍历数组求最大值：for (int i = 0; i < n; i++) { if (arr[i] > max) max = arr[i]; } 最后用 printf 输出结果。",
            "为什么我的 Python 脚本报 KeyError: 'user_id'？我用 requests 读取 JSON 响应后直接写了 data['user_id']，如果这个键可能不存在，应该改用 data.get('user_id')。",
            "用 Express 写一个最简单的健康检查接口：app.get('/health', (req, res) => res.json({ status: 'ok' }))，然后调用 app.listen(3000) 启动服务。",
            "执行 git rebase -i HEAD~3 可以把最近三次提交合并成一次，把需要合并的提交前面改成 s，保存退出后再编辑合并后的提交信息。",
            "用 Python 的列表实现一个栈：class Stack，在 push 方法里调用 self.items.append(item)，pop 方法返回 self.items.pop()。",
            "运行 docker run -d -p 5432:5432 -e POSTGRES_PASSWORD=secret postgres:16 启动数据库容器，记得挂载数据卷，否则容器重启后数据会丢失。",
        ],
    },
    "reference_documentation": {
        "en": [
            "Syntax: find [path] [expression]. Options: -name pattern matches the file name against a shell pattern; -type f restricts the search to regular files; -mtime n selects files modified n days ago.",
            "Mount Kilimanjaro is a dormant volcano in Tanzania and the highest mountain in Africa, rising 5,895 metres above sea level. It has three volcanic cones: Kibo, Mawenzi and Shira.",
            "Configuration reference. log_level (string): one of debug, info, warning, error. Default: info. max_connections (integer): the maximum number of simultaneous client connections. Default: 100.",
            "Getting started: this guide walks you through creating your first project. Step 1: download the installer for your operating system. Step 2: run it and follow the prompts. Step 3: sign in.",
            "The mitochondrion is an organelle found in most eukaryotic cells. It generates most of the cell's supply of adenosine triphosphate (ATP), used as a source of chemical energy. See also: cellular respiration.",
            "Troubleshooting: if the device does not turn on, check that the battery is charged and the power cable is firmly connected. If the status light blinks red, contact support with the error code shown.",
        ],
        "zh": [
            "语法：find [路径] [表达式]。常用选项：-name 按文件名匹配通配符模式；-type f 只查找普通文件；-mtime n 查找 n 天前修改过的文件。",
            "乞力马扎罗山是位于坦桑尼亚的一座休眠火山，海拔五千八百九十五米，是非洲最高峰，由基博、马文济和希拉三座火山锥组成。",
            "配置参考。log_level（字符串）：可选 debug、info、warning、error，默认值为 info。max_connections（整数）：允许同时连接的最大客户端数量，默认值为 100。",
            "快速入门：本指南将引导您创建第一个项目。第一步，下载适用于您操作系统的安装程序；第二步，运行安装程序并按提示操作；第三步，登录账户。",
            "线粒体是大多数真核细胞中的一种细胞器，为细胞提供大部分的三磷酸腺苷（ATP），是细胞的能量来源。参见：细胞呼吸。",
            "故障排除：如果设备无法开机，请检查电池是否已充电、电源线是否连接牢固。如果状态指示灯闪烁红色，请记下错误代码并联系技术支持。",
        ],
    },
    "forums_dialogue": {
        "en": [
            "Quick question for the group: does anyone know a good vet near the station? My cat stopped eating yesterday and I'm a bit worried. Thanks in advance!",
            "lol same here, I thought I was the only one who can't stand that show. My husband loves it though so I'm stuck watching it every Sunday haha",
            "Reply #14: Tried everything in this thread and my laptop still won't connect to wifi after the update. Finally rolled back the driver and now it works. Hope this helps someone.",
            "Mom: Did you eat yet? Me: Not yet, still at work. Mom: Don't skip dinner again. Me: I won't, I promise. Mom: And call your grandmother this weekend.",
            "Am I wrong for not wanting to lend my brother money again? He still owes me from last year and never even mentioned it. Would love some honest opinions.",
            "Just wanted to share that I finally passed my driving test on the fourth try!! Thanks to everyone here who gave me tips on parallel parking, you guys are the best.",
        ],
        "zh": [
            "问一下大家，车站附近有没有靠谱的宠物医院？我家猫从昨天开始就不吃东西了，有点担心，先谢谢各位！",
            "哈哈我也是，还以为只有我受不了那个节目。不过我老公超爱看，害得我每个周日都得陪着看，无语。",
            "十四楼回复：帖子里的方法我都试过了，更新系统后笔记本还是连不上无线网，最后把网卡驱动回退了才好，希望对大家有帮助。",
            "妈：吃饭了吗？我：还没，还在加班。妈：别又不吃晚饭。我：知道啦，保证不会。妈：周末记得给奶奶打个电话。",
            "不想再借钱给我哥，我是不是太过分了？他去年借的钱到现在都没还，提都没提过。想听听大家真实的看法。",
            "终于考过驾照了，第四次才过！！谢谢论坛里教我侧方停车的各位大佬，你们太好了。",
        ],
    },
    "legal_government": {
        "en": [
            "The Tenant shall not sublet the premises or any part thereof without the prior written consent of the Landlord, such consent not to be unreasonably withheld.",
            "Notice of public hearing: the Planning Commission will consider the proposed rezoning of parcels 14 through 22 at its meeting on March 3. Written comments may be submitted to the Clerk until February 28.",
            "The appellant argues that the trial court erred in admitting the expert testimony. We disagree. The standard of review is abuse of discretion, and the court below applied the correct test.",
            "Pursuant to Regulation 2021/45, all food business operators must register with the competent authority before commencing operations. Failure to register is an offence.",
            "To renew your passport, complete the renewal form, attach two recent photographs and your old passport, and pay the fee. Applications from abroad should be sent to the nearest consulate.",
            "Article 12. Any dispute arising out of or in connection with this contract shall be referred to and finally resolved by arbitration under the rules of the chamber of commerce.",
        ],
        "zh": [
            "未经出租人事先书面同意，承租人不得将租赁房屋全部或部分转租给第三方，出租人不得无故拒绝同意。",
            "听证公告：规划委员会定于三月三日召开会议，审议第十四至二十二号地块的规划调整方案。公众可于二月二十八日前向办公室提交书面意见。",
            "上诉人认为一审法院采信鉴定意见有误。本院经审理认为，一审法院适用法律正确，程序合法，上诉理由不能成立，驳回上诉，维持原判。",
            "根据《食品安全管理办法》的规定，食品经营者在开展经营活动前应当依法向主管部门办理登记，未经登记擅自经营的，依法予以处罚。",
            "办理护照换发：填写换发申请表，附近期免冠照片两张及原护照，并缴纳相关费用。在境外的申请人可向就近的使领馆提出申请。",
            "第十二条 因本合同引起的或与本合同有关的任何争议，均应提交仲裁委员会，按照申请仲裁时该会现行有效的仲裁规则进行仲裁。",
        ],
    },
    "commerce": {
        "en": [
            "Wireless noise-cancelling headphones, 30-hour battery, fast charging. Was $199, now $149. In stock, ships within 24 hours. Buy now or add to your wishlist.",
            "Book your stay at our seaside hotel and get breakfast included. Double rooms from $95 per night. Free cancellation up to 48 hours before arrival.",
            "Five stars. Ordered the running shoes in a size up as suggested and they fit perfectly. Delivery was quick and the box was well packed. Would buy again.",
            "Looking for a reliable plumber? We offer 24/7 emergency repairs, fixed prices and a 12-month guarantee on all work. Get a free quote online in two minutes.",
            "Black Friday deal: buy two, get one free on all skincare products. Limited time only, while stocks last. Members earn double reward points on every purchase.",
            "Handmade ceramic mugs, each one unique. Dishwasher safe, holds 350 ml. Gift wrapping available at checkout. Free delivery on orders over $40.",
        ],
        "zh": [
            "无线降噪耳机，续航三十小时，支持快充。原价一千三百九十九元，现价九百九十九元，现货，二十四小时内发货，立即购买或加入收藏。",
            "预订我们的海景酒店即享免费早餐，双人房每晚六百元起，入住前四十八小时可免费取消。",
            "五星好评！按客服建议买大了一码，穿着刚刚好。物流很快，包装也很严实，还会回购的。",
            "找靠谱的水电维修师傅？我们提供全天候上门抢修服务，明码标价，所有维修项目保修十二个月，在线两分钟即可免费获取报价。",
            "双十一特惠：全场护肤品买二送一，限时限量，售完即止。会员每笔消费可获得双倍积分。",
            "纯手工陶瓷马克杯，每一只都独一无二，可以放进洗碗机，容量三百五十毫升。结账时可选择礼品包装，满两百元包邮。",
        ],
    },
}

SUBJECTS = list(HELD_OUT)


def held_out(language: str) -> tuple[list[str], list[str]]:
    texts = [text for subject in SUBJECTS for text in HELD_OUT[subject][language]]
    labels = [subject for subject in SUBJECTS for _ in HELD_OUT[subject][language]]
    return texts, labels


def accuracy(assignments: list[Assignment], labels: list[str]) -> float:
    return sum(a.subject == label for a, label in zip(assignments, labels, strict=True)) / len(labels)


def unit(*rows: list[float]) -> np.ndarray:
    matrix = np.array(rows, dtype=np.float64)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


# -- the bundled prototypes and the held-out set


def test_the_bundled_prototypes_cover_every_subject_in_english_and_chinese():
    prototypes = load_prototypes(None)
    assert set(prototypes) == set(SUBJECTS)
    for subject, languages in prototypes.items():
        assert set(languages) == {"en", "zh"}, subject
        for language, texts in languages.items():
            assert 4 <= len(texts) <= 6, (subject, language)


def test_held_out_examples_are_not_prototypes():
    prototypes = load_prototypes(None)
    every_prototype = [t for languages in prototypes.values() for texts in languages.values() for t in texts]
    for subject in SUBJECTS:
        for language in ("en", "zh"):
            examples = HELD_OUT[subject][language]
            assert len(examples) >= 5, (subject, language)
            for example in examples:
                assert all(example[:30] not in prototype for prototype in every_prototype), example


def test_the_prototypes_file_ships_with_the_package():
    # setup.cfg's package_data takes *.yaml from every package; the module finds the file next to itself.
    assert subjects_module.DEFAULT_PROTOTYPES.name == "subjects.yaml"
    assert subjects_module.DEFAULT_PROTOTYPES.is_file()
    assert subjects_module.PROTOTYPE_VECTORS.is_file()


def test_the_stored_prototype_vectors_are_the_bundled_encoders_and_nothing_else():
    """The package's prototype_vectors.npz holds, for each language of the bundled prototypes, what the bundled
    encoder makes of them now, and no other entry: run `make prototype-vectors` when this fails."""
    from pipeline.embeddings import encode

    encoder = EncoderConfig()
    groups = subjects_module.bundled_prototype_groups()
    stored = subjects_module.bundled_prototype_vectors()
    keys = {language: subjects_module.prototype_key(texts, encoder) for language, texts in groups.items()}
    assert set(stored) == set(keys.values()), (
        "stale pipeline/quality/prototype_vectors.npz: make prototype-vectors"
    )
    for language, texts in groups.items():
        np.testing.assert_allclose(
            stored[keys[language]], encode(texts, encoder), atol=1e-5, err_msg=language
        )


def test_stored_prototype_vectors_stand_only_for_the_texts_and_encoder_they_were_made_with():
    from pipeline.embeddings import encode

    encoder = EncoderConfig()
    texts = subjects_module.bundled_prototype_groups()["en"]
    assert (
        subjects_module.embed_prototypes(texts, encoder)
        is subjects_module.bundled_prototype_vectors()[subjects_module.prototype_key(texts, encoder)]
    )
    # Any change to what the vectors depend on is another key: embedded afresh.
    for other_texts, other_encoder in [
        (texts[:-1], encoder),
        (list(reversed(texts)), encoder),
        (texts, EncoderConfig(max_seq_length=128)),
        (texts, EncoderConfig(batch_size=8)),
    ]:
        key = subjects_module.prototype_key(other_texts, other_encoder)
        assert key not in subjects_module.bundled_prototype_vectors()
        np.testing.assert_allclose(
            subjects_module.embed_prototypes(other_texts, other_encoder),
            encode(other_texts, other_encoder),
            atol=1e-6,
        )
    assert subjects_module.prototype_key(texts, EncoderConfig(model="/some/local/folder")) is None


# -- accuracy on the held-out documents, with the default config


def test_chinese_held_out_accuracy_by_the_character_ngram_fallback():
    # Measured: 40 of 48 (0.833) with the default top-3 mean; 38 of 48 (0.792) scoring by the best prototype.
    # Eight subjects, so chance is 0.125. No encoder is loaded: the English one does not route Chinese.
    texts, labels = held_out("zh")
    config = SubjectConfig()
    found = assign_by_char_ngrams(
        texts,
        {s: texts_["zh"] for s, texts_ in load_prototypes(None).items()},
        scoring=config.scoring,
        top_k=config.top_k,
        min_similarity=config.fallback_min_similarity,
    )
    assert accuracy(found, labels) >= 0.77
    assert all(a.method == CHAR_NGRAM_TFIDF for a in found)


def test_chinese_documents_take_the_fallback_and_never_reach_the_english_encoder(monkeypatch):
    def no_encoder(texts, config):
        raise AssertionError("the encoder was asked to embed Chinese")

    monkeypatch.setattr(subjects_module, "encode", no_encoder)
    texts, labels = held_out("zh")
    found = assign_documents(texts, ["zh"] * len(texts), SubjectConfig(), EncoderConfig())
    assert accuracy(found, labels) >= 0.77
    assert subject_coverage(found, SUBJECTS, 0.02)["methods"] == {
        ENCODER: 0,
        CHAR_NGRAM_TFIDF: len(texts),
        ENCODER_UNCOVERED: 0,
    }


@pytest.mark.slow
def test_english_held_out_accuracy_with_the_bundled_encoder():
    # Measured with all-MiniLM-L6-v2: 38 of 48 (0.792) with the default top-3 mean; 33 of 48 (0.688) scoring
    # by the best prototype, which is why the default averages.
    texts, labels = held_out("en")
    found = assign_documents(texts, ["en"] * len(texts), SubjectConfig(), EncoderConfig())
    assert accuracy(found, labels) >= 0.72
    assert all(a.method == ENCODER for a in found)
    assert SubjectConfig(scoring="max").scoring == "max"
    by_max = assign_documents(texts, ["en"] * len(texts), SubjectConfig(scoring="max"), EncoderConfig())
    assert accuracy(by_max, labels) < accuracy(found, labels)


@pytest.mark.slow
def test_the_english_encoder_on_chinese_is_why_the_fallback_exists():
    # Measured: embedded anyway (fallback none), 24 of 48 Chinese documents (0.500) get their subject, against
    # 40 of 48 by the fallback.
    texts, labels = held_out("zh")
    anyway = assign_documents(texts, ["zh"] * len(texts), SubjectConfig(fallback="none"), EncoderConfig())
    assert all(a.method == ENCODER_UNCOVERED for a in anyway)
    fallback = assign_documents(texts, ["zh"] * len(texts), SubjectConfig(), EncoderConfig())
    assert accuracy(anyway, labels) + 0.2 < accuracy(fallback, labels)


@pytest.mark.slow
def test_a_mixed_sample_counts_each_path_and_reuses_the_callers_embeddings():
    from pipeline.embeddings import encode

    english, _ = held_out("en")
    chinese, _ = held_out("zh")
    texts = [english[0], chinese[0], english[7], "Guten Morgen, wie geht es dir heute?", chinese[9]]
    languages = ["en", "zh-Hans", None, "de", "zh"]
    config, encoder = SubjectConfig(), EncoderConfig()
    found = assign_documents(texts, languages, config, encoder)
    assert [a.method for a in found] == [
        ENCODER,
        CHAR_NGRAM_TFIDF,
        ENCODER,
        ENCODER_UNCOVERED,
        CHAR_NGRAM_TFIDF,
    ]
    given_vectors = assign_documents(texts, languages, config, encoder, embeddings=encode(texts, encoder))
    assert [a.subject for a in given_vectors] == [a.subject for a in found]
    np.testing.assert_allclose(
        [a.similarity for a in given_vectors], [a.similarity for a in found], atol=1e-5
    )
    assert subject_coverage(found, SUBJECTS, 0.02)["methods"] == {
        ENCODER: 2,
        CHAR_NGRAM_TFIDF: 2,
        ENCODER_UNCOVERED: 1,
    }


# -- assignment on synthetic vectors

PROTOTYPES = {
    "alpha": unit([1, 0, 0], [0.9, 0.1, 0]),
    "beta": unit([0, 1, 0], [0, 0.8, 0.2]),
    "gamma": unit([0, 0, 1]),
}


def test_the_best_subject_and_its_margin_over_the_second():
    (found,) = assign_subjects(unit([0.8, 0.6, 0]), PROTOTYPES, scoring="max")
    assert found.subject == "alpha"
    assert found.similarity == pytest.approx(0.8 * 0.9 / np.hypot(0.9, 0.1) + 0.6 * 0.1 / np.hypot(0.9, 0.1))
    assert found.margin == pytest.approx(found.similarity - 0.6)
    assert found.method == ENCODER


def test_below_min_similarity_a_document_is_unassigned_but_keeps_its_scores():
    far = unit([-1, -1, -1])  # -0.577 to every basis prototype
    (found,) = assign_subjects(far, PROTOTYPES, scoring="max", min_similarity=0.05)
    assert found.subject == UNASSIGNED
    assert found.similarity < 0.05
    (kept,) = assign_subjects(far, PROTOTYPES, scoring="max", min_similarity=-1.0)
    assert kept.subject != UNASSIGNED


def test_top_k_mean_averages_a_subjects_best_prototypes():
    doc = unit([1, 0, 0])
    (by_max,) = assign_subjects(doc, PROTOTYPES, scoring="max")
    (by_mean,) = assign_subjects(doc, PROTOTYPES, scoring="top_k_mean", top_k=2)
    assert by_max.similarity == pytest.approx(1.0)
    assert by_mean.similarity == pytest.approx((1.0 + 0.9 / np.hypot(0.9, 0.1)) / 2)
    # gamma has one prototype: its top-2 mean is that one
    (third,) = assign_subjects(unit([0, 0, 1]), PROTOTYPES, scoring="top_k_mean", top_k=2)
    assert (third.subject, third.similarity) == ("gamma", pytest.approx(1.0))


def test_embeddings_from_another_encoder_are_refused():
    with pytest.raises(ValueError, match="4 dimensions and the prototypes' 3"):
        assign_subjects(unit([1, 0, 0, 0]), PROTOTYPES)


def test_the_fallback_takes_only_languages_every_subject_has(tmp_path):
    path = write(
        tmp_path / "partial.yaml",
        "news:\n  en: [the council voted]\n  zh: [市议会投票]\ncode:\n  en: [def main()]\n",
    )
    config = SubjectConfig(prototypes=path)
    assert fallback_languages(config, load_prototypes(path)) == ["en"]
    assert fallback_languages(SubjectConfig(fallback="none"), load_prototypes(path)) == []
    assert fallback_languages(SubjectConfig(), load_prototypes(None)) == ["en", "zh"]


def test_a_tie_has_margin_zero_and_goes_to_the_first_subject():
    found = assign_from_scores(np.array([[0.4, 0.4, 0.1]]), ["a", "b", "c"], min_similarity=0.0)
    assert found == [Assignment("a", 0.4, 0.0, ENCODER)]


@given(
    st.lists(st.lists(st.floats(-1, 1, allow_nan=False), min_size=3, max_size=3), min_size=1, max_size=30),
    st.floats(-1, 1),
)
def test_the_assignment_is_the_best_score_and_the_margin_is_never_negative(rows, min_similarity):
    scores = np.array(rows)
    for found, row in zip(assign_from_scores(scores, ["a", "b", "c"], min_similarity), scores, strict=True):
        assert found.similarity == row.max()
        assert found.margin == pytest.approx(row.max() - np.sort(row)[-2])
        assert found.margin >= 0
        assert (found.subject == UNASSIGNED) == (row.max() < min_similarity)


# -- coverage


def test_coverage_counts_shares_margins_low_confidence_and_flags():
    assignments = [
        Assignment("news", 0.5, 0.10),
        Assignment("news", 0.4, 0.01),
        Assignment("news", 0.3, 0.04),
        Assignment("code", 0.6, 0.20, CHAR_NGRAM_TFIDF),
        Assignment(UNASSIGNED, 0.01, 0.0),
    ]
    coverage = subject_coverage(assignments, ["news", "code", "literature"], min_share=0.25, min_margin=0.02)
    assert coverage["documents"] == 5
    assert coverage["subjects"]["news"] == {
        "documents": 3,
        "share": 0.6,
        "mean_margin": pytest.approx(0.05),
        "low_confidence": 1,
    }
    assert coverage["subjects"]["literature"] == {
        "documents": 0,
        "share": 0.0,
        "mean_margin": None,
        "low_confidence": 0,
    }
    assert coverage[UNASSIGNED] == {"documents": 1, "share": 0.2}
    assert coverage["under_min_share"] == ["code", "literature"]
    assert coverage["methods"] == {ENCODER: 4, CHAR_NGRAM_TFIDF: 1, ENCODER_UNCOVERED: 0}


def test_no_min_share_flags_nothing_and_an_empty_sample_has_zero_shares():
    assert subject_coverage([Assignment("news", 0.5, 0.1)], ["news", "code"], None)["under_min_share"] == []
    empty = subject_coverage([], ["news", "code"], 0.1)
    assert empty["documents"] == 0 and empty[UNASSIGNED]["share"] == 0.0
    assert empty["under_min_share"] == ["news", "code"], "nothing sampled: no subject is covered"


@given(st.lists(st.sampled_from(["news", "code", "literature", UNASSIGNED]), min_size=1), st.floats(0, 1))
def test_shares_sum_to_one_with_the_unassigned_bucket(labels, min_share):
    coverage = subject_coverage(
        [Assignment(label, 0.5, 0.1) for label in labels], ["news", "code"], min_share
    )
    shares = [row["share"] for row in coverage["subjects"].values()] + [coverage[UNASSIGNED]["share"]]
    assert sum(shares) == pytest.approx(1.0)
    assert sum(row["documents"] for row in coverage["subjects"].values()) + coverage[UNASSIGNED][
        "documents"
    ] == len(labels)
    assert coverage["under_min_share"] == [
        subject for subject, row in coverage["subjects"].items() if row["share"] < min_share
    ]


def test_plot_subjects_writes_a_png(tmp_path):
    coverage = subject_coverage(
        [Assignment("news", 0.5, 0.1), Assignment(UNASSIGNED, 0.0, 0.0)], ["news", "code"], 0.1
    )
    path = plot_subjects(coverage, tmp_path / "subjects.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- languages


def test_routes_match_languages_on_the_primary_tag():
    assert routes(["en", "EN-gb", None, "zh-Hans", "zh_CN", "de"], ["en"], ["en", "zh"]) == [
        ENCODER,
        ENCODER,
        ENCODER,
        CHAR_NGRAM_TFIDF,
        CHAR_NGRAM_TFIDF,
        ENCODER_UNCOVERED,
    ]
    # a multilingual encoder covers Chinese itself
    assert routes(["zh"], ["en", "zh"], ["en", "zh"]) == [ENCODER]


def test_language_warnings_name_each_language_the_encoder_lacks_and_the_path_taken():
    warnings = language_warnings(["en", "zh", "zh", "de", None], ["en"], ["en", "zh"], "all-MiniLM-L6-v2")
    assert len(warnings) == 2
    german, chinese = warnings
    assert german.startswith("1 of 5 sampled documents are in 'de'") and "embedded anyway" in german
    assert chinese.startswith("2 of 5 sampled documents are in 'zh'") and "all-MiniLM-L6-v2" in chinese
    assert "TF-IDF" in chinese and "quality.encoder.languages: en" in chinese
    assert language_warnings(["en", None], ["en"]) == []
    assert language_warnings(["zh"], ["en", "zh"]) == []


# -- a prototypes file of one's own


def write(path, text: str | bytes):
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_prototypes_file_replaces_the_bundled_one(tmp_path):
    path = write(
        tmp_path / "mine.yaml",
        "cooking:\n  zh: [烤箱预热后放入蛋糕烤二十分钟, 面粉加水揉成面团]\n"
        "sport:\n  zh: [主队在比赛最后时刻进球获胜, 运动员打破了全国纪录]\n",
    )
    config = SubjectConfig(prototypes=path)
    assert load_prototypes(config.prototypes) == {
        "cooking": {"zh": ["烤箱预热后放入蛋糕烤二十分钟", "面粉加水揉成面团"]},
        "sport": {"zh": ["主队在比赛最后时刻进球获胜", "运动员打破了全国纪录"]},
    }
    found = assign_documents(["把面团放进烤箱", "他在比赛中进球"], ["zh", "zh"], config, EncoderConfig())
    assert [a.subject for a in found] == ["cooking", "sport"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "does not exist"),
        (b"\xff\xfe news", "is not UTF-8 text"),
        ("news: [unclosed", "is not valid YAML"),
        ("- a\n- b\n", "expected a mapping of subject -> language -> texts, got list"),
        ("news:\n  en: [a]\n", "needs at least two subjects, found 1"),
        ("News:\n  en: [a]\ncode:\n  en: [b]\n", "subject 'News'"),
        ("unassigned:\n  en: [a]\ncode:\n  en: [b]\n", "not 'unassigned'"),
        ("news: [a, b]\ncode:\n  en: [b]\n", "subject 'news': expected a mapping of language -> texts"),
        (
            "news:\n  en: just one text\ncode:\n  en: [b]\n",
            "subject 'news', language 'en': expected a non-empty list",
        ),
        ("news:\n  en: []\ncode:\n  en: [b]\n", "subject 'news', language 'en': expected a non-empty list"),
        (
            "news:\n  en: [a, '  ']\ncode:\n  en: [b]\n",
            "subject 'news', language 'en', text 2: expected a non-empty",
        ),
    ],
)
def test_a_bad_prototypes_file_names_the_file_and_the_problem(tmp_path, content, problem):
    path = str(tmp_path / "bad.yaml") if content is None else write(tmp_path / "bad.yaml", content)
    with pytest.raises(ConfigError) as raised:
        load_prototypes(path)
    assert str(raised.value).startswith(f"prototypes file {path}: ")
    assert problem in str(raised.value)
    # and the config refuses it when loaded, before any work starts
    with pytest.raises(ValidationError) as refused:
        SubjectConfig(prototypes=path)
    assert f"prototypes file {path}: " in str(refused.value) and problem in str(refused.value)
