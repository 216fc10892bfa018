"""JAX stays unstarted in a process that uses searchgym's BM25, and a user's own JAX still works.

bm25s runs ``jax.lax.top_k`` when it is imported next to JAX, which starts JAX's backends
(on a GPU: 75% of its memory). These tests run in fresh interpreters with the real (CPU)
JAX installed: a started backend shows in ``jax._src.xla_bridge._backends``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax", reason="JAX is in the test extra: pip install -e '.[test]'")

BM25_RUN = """
import searchgym
from searchgym.envs.records import Doc
from searchgym.retrieval import BM25Retriever
docs = [Doc(id="1", title="Paris", text="the capital of France"),
        Doc(id="2", title="Berlin", text="the capital of Germany")]
retriever = BM25Retriever(docs)
retriever.save(TMP)
hits = BM25Retriever.load(TMP).search(["capital of France"], k=1)
"""


def run(code: str, tmp_path) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line, returned decoded."""
    script = f"TMP = {str(tmp_path / 'index')!r}\n" + textwrap.dedent(code)
    env = {"JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, **env},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_bm25_build_and_search_leave_jax_unstarted(tmp_path):
    out = run(
        BM25_RUN
        + """
import json
from jax._src import xla_bridge  # imported only now, to look
print(json.dumps({"hit": hits[0][0].id, "backends": sorted(xla_bridge._backends)}))
""",
        tmp_path,
    )
    assert out == {"hit": "1", "backends": []}


def test_jax_imported_by_the_user_first_stays_unstarted_and_works(tmp_path):
    out = run(
        """
import sys
import jax, jax.lax, jax.numpy as jnp
from jax._src import xla_bridge
before = sys.modules["jax"], sys.modules["jax.lax"]
"""
        + BM25_RUN
        + """
import json
unstarted = sorted(xla_bridge._backends)
same = (sys.modules["jax"], sys.modules["jax.lax"]) == before
values, indices = jax.lax.top_k(jnp.array([3.0, 1.0, 2.0]), 2)
print(json.dumps({"hit": hits[0][0].id, "unstarted": unstarted, "same": same,
                  "top_k": [indices.tolist(), values.tolist()], "after": sorted(xla_bridge._backends)}))
""",
        tmp_path,
    )
    assert out == {
        "hit": "1",
        "unstarted": [],
        "same": True,
        "top_k": [[0, 2], [3.0, 2.0]],
        "after": ["cpu"],
    }


def test_jax_started_by_the_user_keeps_working(tmp_path):
    out = run(
        """
import jax.numpy as jnp
total = float(jnp.arange(4).sum())
"""
        + BM25_RUN
        + """
import json, jax
print(json.dumps({"hit": hits[0][0].id, "total": total, "again": float(jax.numpy.ones(3).sum())}))
""",
        tmp_path,
    )
    assert out == {"hit": "1", "total": 6.0, "again": 3.0}


def test_a_failed_guarded_import_puts_sys_modules_back():
    from searchgym.retrieval.jax_guard import HIDDEN, import_without_jax

    before = {key: sys.modules.get(key, "absent") for key in HIDDEN}
    with pytest.raises(ModuleNotFoundError):
        import_without_jax("searchgym_no_such_module")
    assert {key: sys.modules.get(key, "absent") for key in HIDDEN} == before
