"""A multiple-choice lm-eval task kept locally, as a user keeps one: a task YAML with templates and a JSON
file of seeded random questions."""

from __future__ import annotations

import json
import random
from pathlib import Path

LOCAL_TASK = "local_questions"
LOCAL_ITEMS = 12
LOCAL_TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
description: "Answer the question.\\n\\n"
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{options}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def write_local_task(folder: Path, rng: random.Random) -> Path:
    """A multiple-choice task as a user keeps one locally: a YAML with templates, a JSON file of random
    questions (two to five options of different lengths, the answer given as its text)."""
    words = [
        "river",
        "stone",
        "light",
        "paper",
        "garden",
        "window",
        "music",
        "winter",
        "market",
        "bridge",
        "silver",
        "forest",
    ]
    rows = []
    for _ in range(LOCAL_ITEMS):
        options = [" ".join(rng.choices(words, k=rng.randint(1, 4))) for _ in range(rng.randint(2, 5))]
        options = list(dict.fromkeys(options))
        if len(options) < 2:
            options.append("none of these")
        question = " ".join(rng.choices(words, k=6)) + "?"
        rows.append({"question": question, "options": options, "answer": rng.choice(options)})
    folder.mkdir(parents=True)
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / f"{LOCAL_TASK}.yaml").write_text(
        LOCAL_TASK_YAML.format(task=LOCAL_TASK, data=json.dumps(str(data)))
    )
    return folder
