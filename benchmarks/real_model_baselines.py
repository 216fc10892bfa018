"""No-learning baselines for the warm-started GRPO run on PopQA, on its 100 held-out questions.

    python -m benchmarks.real_model_baselines
    python -m benchmarks.real_model_table   # writes the table into docs/real_model.md

``benchmarks/real_model_train.py --heldout 100`` trains on the PopQA sample without the
first 100 questions of ``evaluate``'s seed-0 order and evaluates on them. This script
takes the same split (:func:`split`), the same env (``configs/grpo_smollm2_cpu_warm.yaml``'s
``env`` section: PopQA, BM25 over the shared corpus) and the env's own retriever and
scores, and answers each held-out question without any model:

* **template prior**: the most frequent first gold answer of the training questions of the
  question's template ("What is X's occupation?" or "In what city was X born?").
* **extraction heuristic**: one search, the question as the query (the warm start's first
  action), and the top-1 passage (title and text) read by rules: for place of birth, the
  capitalised words after "born ... in" (not a month); otherwise the training answer of the same template that the passage
  names first; otherwise the template prior.

It also measures how the split overlaps: the templates of the held-out questions, how
many held-out questions have a gold answer that is a gold answer of a training question,
and how many share their subject with a training question. Every question's outputs
(query, passage, answers, rule, scores) are kept in the result file.
"""

from __future__ import annotations

import argparse
import collections
import re
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, write_report

TEMPLATES = {
    "occupation": re.compile(r"^What is (?P<subject>.+)'s occupation\?$"),
    "place of birth": re.compile(r"^In what city was (?P<subject>.+) born\?$"),
}
"""PopQA's two question templates in the shared sample, by relation."""
BORN = re.compile(r"\bborn\b[^.;]*")
"""'born' and the rest of its clause."""
IN_PLACE = re.compile(r"\bin (?P<place>[A-Z][\w'-]*(?: [A-Z][\w'-]*)*)")
"""'in X': X is the capitalised words after 'in'."""
MONTHS = {"January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"}  # fmt: skip
"""'born in May 1950' names a date, not a place."""


def template(question: str) -> tuple[str, str]:
    """The question's relation and subject, read from its wording."""
    for relation, pattern in TEMPLATES.items():
        match = pattern.match(question)
        if match:
            return relation, match["subject"]
    raise SystemExit(f"no PopQA template matches {question!r}; add its pattern to TEMPLATES")


def split(env_kwargs: dict[str, Any], count: int) -> tuple[list[Any], list[Any]]:
    """(held-out, training) questions exactly as ``real_model_train.py``'s ``hold_out`` splits them."""
    import gymnasium as gym
    import numpy as np

    import searchgym  # noqa: F401  (registers the ids)

    questions = gym.make("searchgym/PopQA-v1", **env_kwargs).unwrapped.questions
    heldout = [int(i) for i in np.random.default_rng(0).permutation(len(questions))[:count]]
    chosen = set(heldout)
    return [questions[i] for i in heldout], [q for i, q in enumerate(questions) if i not in chosen]


def dictionary(train: list[Any]) -> dict[str, collections.Counter[str]]:
    """Per relation, how often each first gold answer occurs among the training questions."""
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for q in train:
        counts[template(q.question)[0]][q.golden_answers[0]] += 1
    return counts


def extract(passage: str, relation: str, answers: collections.Counter[str]) -> tuple[str, str]:
    """The heuristic's answer from one passage, and the rule that gave it."""
    if relation == "place of birth":
        for clause in BORN.finditer(passage):
            for match in IN_PLACE.finditer(clause[0]):
                if match["place"].split()[0] not in MONTHS:
                    return match["place"], "born in"
    lowered = passage.lower()
    found = []
    for answer in answers:
        hit = re.search(rf"\b{re.escape(answer.lower())}\b", lowered)
        if hit:
            found.append((hit.start(), -answers[answer], answer))
    if found:
        return min(found)[2], "training answer in passage"
    return answers.most_common(1)[0][0], "prior"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "grpo_smollm2_cpu_warm.yaml")
    parser.add_argument(
        "--heldout", type=int, default=100, help="held-out questions (as in real_model_train.py)"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "real_model_baselines.json"
    )
    args = parser.parse_args()

    import gymnasium as gym

    from searchgym.envs.metrics import exact_match, f1_score, normalize_answer
    from searchgym.trainers.run_spec import load_config

    config = load_config(args.config)
    env_kwargs = dict(config.env.kwargs)
    heldout, train = split(env_kwargs, args.heldout)
    counts = dictionary(train)
    prior = {relation: answers.most_common(1)[0][0] for relation, answers in counts.items()}
    train_golds = {normalize_answer(a) for q in train for a in q.golden_answers}
    train_subjects = {template(q.question)[1] for q in train}

    start = time.perf_counter()
    retriever = gym.make(config.env.id, **env_kwargs).unwrapped.retriever  # the env's BM25
    passages = retriever.search([q.question for q in heldout], 1)
    rows = []
    for q, (doc,) in zip(heldout, passages, strict=True):
        relation, subject = template(q.question)
        text = f"{doc.title}\n{doc.text}"
        answer, rule = extract(text, relation, counts[relation])
        rows.append(
            {
                "question_id": q.id,
                "question": q.question,
                "relation": relation,
                "golds": list(q.golden_answers),
                "gold_in_training_answers": any(normalize_answer(a) in train_golds for a in q.golden_answers),
                "subject_in_training": subject in train_subjects,
                "query": q.question,
                "passage_id": doc.id,
                "heuristic": {"answer": answer, "rule": rule, "em": exact_match(answer, q.golden_answers),
                              "f1": f1_score(answer, q.golden_answers)},
                "prior": {"answer": prior[relation], "em": exact_match(prior[relation], q.golden_answers),
                          "f1": f1_score(prior[relation], q.golden_answers)},
            }
        )  # fmt: skip
    wall = time.perf_counter() - start

    def mean(name: str, key: str, keep: Any = lambda r: True) -> float:
        chosen = [r[name][key] for r in rows if keep(r)]
        return sum(chosen) / len(chosen) if chosen else float("nan")

    relations = collections.Counter(r["relation"] for r in rows)
    summary = {
        name: {
            "em": mean(name, "em"),
            "f1": mean(name, "f1"),
            "searches": 1.0 if name == "heuristic" else 0.0,
            "by_relation": {rel: {"n": n, "em": mean(name, "em", lambda r, rel=rel: r["relation"] == rel)}
                            for rel, n in sorted(relations.items())},
        }
        for name in ("heuristic", "prior")
    }  # fmt: skip
    summary["heuristic"]["rules"] = dict(collections.Counter(r["heuristic"]["rule"] for r in rows))
    report = {
        "config": str(args.config.resolve().relative_to(REPO)),
        "questions": len(rows),
        "training_questions": len(train),
        "relations": dict(sorted(relations.items())),
        "gold_in_training_answers": sum(r["gold_in_training_answers"] for r in rows),
        "subject_in_training": sum(r["subject_in_training"] for r in rows),
        "prior_answers": prior,
        "results": summary,
        "wall_time_s": round(wall, 2),
        "rows": rows,
    }
    write_report(args.out, report)
    for name, figures in summary.items():
        print(f"{name}: EM {100 * figures['em']:.1f} F1 {100 * figures['f1']:.1f}")
    print(
        f"relations {report['relations']}; held-out questions with a training gold answer: "
        f"{report['gold_in_training_answers']} of {len(rows)}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
