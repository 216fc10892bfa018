"""Faults of a store's files: a repair never makes things worse, and nothing acknowledged is lost silently.

Each test damages real SQLite files (cut short, WAL damaged or deleted, a repair killed at
every step, a read-only mount) and checks the store against what SQLite itself says the
undamaged file held (``dbstat``), not against the code under test.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from searchgym.envs.rewards import MinToolCallStore
from searchgym.error import DataFileError
from searchgym.memory.store import log_file
from searchgym.storage import SqliteLog

_OLD_TABLES = (  # the layout of a store made by searchgym before this page size and index
    "CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL, key TEXT UNIQUE)",
    "CREATE TABLE snapshots (step INTEGER NOT NULL, last_id INTEGER NOT NULL, time REAL NOT NULL)",
    "CREATE TABLE rejected (id INTEGER, body TEXT, reason TEXT NOT NULL, time REAL NOT NULL)",
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "searchgym.cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def _question(i: int) -> str:
    return f"q{i:05d}-" + "w" * (i % 23)


def _old_store(path: Path, count: int) -> None:
    """A minimum store in the layout older searchgym versions wrote (4 KiB pages, AUTOINCREMENT)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    for statement in _OLD_TABLES:
        conn.execute(statement)
    for i in range(count):
        conn.execute("INSERT INTO records (body) VALUES (?)", (json.dumps({"id": _question(i), "n": i % 7}),))
    conn.close()


def _leaves(path: Path) -> list[tuple[int, list[int]]]:
    """``(page, ids)`` of each leaf page of ``records``, from SQLite's own ``dbstat`` of a sound file.

    The ids are 1..N appended in order, so the leaves in key order (``dbstat``'s ``path``)
    hold consecutive runs of them.
    """
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = conn.execute(
        "SELECT pageno, ncell FROM dbstat WHERE name = 'records' AND pagetype = 'leaf' ORDER BY path"
    ).fetchall()
    conn.close()
    leaves, first = [], 1
    for page, cells in rows:
        leaves.append((page, list(range(first, first + cells))))
        first += cells
    return leaves


def _page_size(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    conn.close()
    return size


# -- a file cut short: every row on the pages that remain comes back ----------------------------


@pytest.mark.parametrize("layout", ["current", "older searchgym"])
def test_a_minimum_store_cut_short_gets_back_every_row_on_its_remaining_pages(
    tmp_path: Path, layout: str
) -> None:
    path = tmp_path / "min_tool_calls.sqlite"
    if layout == "current":
        store = MinToolCallStore(path)
        for i in range(1500):
            store.update(_question(i), i % 7)
        store.close()
    else:
        _old_store(path, 1500)
    assert not os.path.exists(f"{path}-wal")
    size = _page_size(path)
    whole_pages = 50_000 // size
    expected = sorted(i for page, ids in _leaves(path) if page <= whole_pages for i in ids)
    with open(path, "r+b") as handle:
        handle.truncate(50_000)  # the file's tail is gone; no WAL
    run = _cli("memory", "repair", str(path))
    assert run.returncode == 0, run.stderr
    minima = MinToolCallStore(path).minima()
    got = sorted(int(q[1:6]) + 1 for q in minima)  # record i has id i + 1
    assert set(expected) <= set(got) and len(expected) >= 300  # every row of a whole page is back ...
    assert all(minima[_question(i - 1)] == (i - 1) % 7 for i in got)  # ... exactly as it was written
    assert f"rebuilt with the {len(got)} readable records" in run.stdout


def test_a_store_cut_short_with_its_wal_beside_it_gets_back_the_wal_rows_too(tmp_path: Path) -> None:
    path = tmp_path / "min_tool_calls.sqlite"
    store = MinToolCallStore(path)
    for i in range(1000):
        store.update(_question(i), i % 7)
    store.close()  # checkpointed: the first 1,000 are in the file
    checkpointed = tmp_path / "checkpointed.sqlite"
    shutil.copyfile(path, checkpointed)
    script = (
        "import os, sys\nfrom searchgym.envs.rewards import MinToolCallStore\n"
        f"s = MinToolCallStore({str(path)!r})\n"
        "for i in range(1000, 1500):\n    s.update(f'q{i:05d}-' + 'w' * (i % 23), i % 7)\n"
        "os._exit(0)\n"  # killed: the last 500 stay in the WAL
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert os.path.getsize(f"{path}-wal") > 0
    size = _page_size(path)
    leaves = _leaves(checkpointed)
    last_leaf = leaves[-1][0]  # the 500 appends rewrote the last leaf of the first 1,000 (in the WAL)
    expected = {i for page, ids in leaves if page * size <= 50_000 or page == last_leaf for i in ids}
    expected |= set(range(1001, 1501))  # on pages the WAL holds
    with open(path, "r+b") as handle:
        handle.truncate(50_000)
    run = _cli("memory", "repair", str(path))
    assert run.returncode == 0, run.stderr
    minima = MinToolCallStore(path).minima()
    got = {int(q[1:6]) + 1 for q in minima}
    assert expected <= got, sorted(expected - got)[:20]
    assert all(minima[_question(i - 1)] == (i - 1) % 7 for i in got)


# -- a repair killed at every step ---------------------------------------------------------------

_CRASHING_REPAIR = """
import os, sys
limit, calls = int(sys.argv[2]), [0]
def counted(name):
    real = getattr(os, name)
    def call(*args, **kwargs):
        result = real(*args, **kwargs)
        calls[0] += 1
        if calls[0] == limit:
            os._exit(70)  # killed right after this change to the file system (or sync)
        return result
    return call
for name in ("rename", "replace", "link", "unlink", "remove", "fsync"):
    setattr(os, name, counted(name))
from searchgym.storage import SqliteLog
report = SqliteLog(sys.argv[1], schema=None).repair()
print(report.kept)
"""


def _damaged_store_with_wal(path: Path) -> None:
    store = MinToolCallStore(path)
    for i in range(400):
        store.update(_question(i), i % 7)
    store.close()
    script = (
        "import os\nfrom searchgym.envs.rewards import MinToolCallStore\n"
        f"s = MinToolCallStore({str(path)!r})\n"
        "for i in range(400, 600):\n    s.update(f'q{i:05d}-' + 'w' * (i % 23), i % 7)\nos._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)


def test_a_repair_killed_after_any_step_leaves_the_old_file_or_the_repaired_one(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    _damaged_store_with_wal(pristine / "min.sqlite")
    original = {s: (pristine / f"min.sqlite{s}").read_bytes() for s in ("", "-wal")}
    reference = tmp_path / "reference"
    shutil.copytree(pristine, reference)
    SqliteLog(reference / "min.sqlite", schema=None).repair()
    repaired = SqliteLog(reference / "min.sqlite", schema=None).read()[0]
    assert 300 < len(repaired) < 600
    for limit in range(1, 40):
        folder = tmp_path / f"crash-{limit}"
        shutil.copytree(pristine, folder)
        path = folder / "min.sqlite"
        run = subprocess.run(
            [sys.executable, "-c", _CRASHING_REPAIR, str(path), str(limit)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode in (0, 70), run.stderr
        assert path.exists(), f"killed after step {limit}: no file at the live path"
        if limit % 2:  # a repair run again at once finishes (or undoes) the interrupted one first
            SqliteLog(path, schema=None).repair()
            assert SqliteLog(path, schema=None).read()[0] == repaired, f"killed after step {limit}"
            assert not [p for p in folder.iterdir() if ".rebuilding-" in p.name or p.name.endswith(".repair")]
            if run.returncode == 0:
                break
            continue
        try:
            after_crash = SqliteLog(path, schema=None).read()[0]  # finishes an interrupted repair
        except DataFileError as error:  # the old, damaged file is still there
            assert "is damaged" in str(error), str(error)
            replaced = False
        else:
            assert after_crash == repaired, f"killed after step {limit}"
            replaced = True
        leftovers = [
            p.name for p in folder.iterdir() if ".rebuilding-" in p.name or p.name.endswith(".repair")
        ]
        assert leftovers == [], f"killed after step {limit}: {leftovers}"
        if replaced:  # the damaged file and its WAL are kept, byte for byte
            kept = [
                p
                for p in folder.iterdir()
                if p.name.startswith("min.sqlite.damaged-") and "-wal" not in p.name
            ]
            assert [p.read_bytes() for p in kept] == [original[""]], f"killed after step {limit}"
            assert Path(f"{kept[0]}-wal").read_bytes() == original["-wal"], f"killed after step {limit}"
        SqliteLog(path, schema=None).repair()
        assert SqliteLog(path, schema=None).read()[0] == repaired, f"killed after step {limit}"
        if run.returncode == 0:
            break
    else:
        pytest.fail("the repair never ran to its end")
    assert limit > 10  # it was killed after each of its steps before that


def test_a_repair_killed_after_its_rebuilt_file_went_live_leaves_no_false_loss(tmp_path: Path) -> None:
    """A file cut short loses acknowledged ids; the repair reports them once. Killed after the
    rebuilt file replaced the live one (with or without its journal still there), the next
    open must not report those ids as missing again."""
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    log = SqliteLog(pristine / "a.sqlite", schema=None)
    for i in range(1500):
        log.append({"i": i})
    log.close()
    with open(pristine / "a.sqlite", "r+b") as handle:
        handle.truncate(os.path.getsize(pristine / "a.sqlite") // 2)
    reference = shutil.copytree(pristine, tmp_path / "reference")
    assert SqliteLog(reference / "a.sqlite", schema=None).repair().missing  # the loss, reported once
    repaired = SqliteLog(reference / "a.sqlite", schema=None).read()[0]
    survived = 0
    for limit in range(1, 40):
        folder = shutil.copytree(pristine, tmp_path / f"crash-{limit}")
        run = subprocess.run(
            [sys.executable, "-c", _CRASHING_REPAIR, str(folder / "a.sqlite"), str(limit)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode in (0, 70), run.stderr
        if run.returncode == 0:
            break
        if any(p.name.startswith("a.sqlite.damaged-") for p in folder.iterdir()):  # the rebuilt file is live
            assert SqliteLog(folder / "a.sqlite", schema=None).read()[0] == repaired, (
                f"killed after step {limit}"
            )
            survived += 1
    assert survived >= 2


def test_a_rebuilt_file_an_older_repair_left_instead_of_the_live_one_is_put_back(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "a.sqlite")
    for i in range(50):
        log.append({"i": i})
    log.close()
    os.rename(tmp_path / "a.sqlite", tmp_path / "a.sqlite.rebuilding-999999999")  # its process is gone
    assert [r["i"] for r in SqliteLog(tmp_path / "a.sqlite").read()[0]] == list(range(50))


# -- a read-only disk ----------------------------------------------------------------------------


def _read_only(folder: Path, command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with ``folder`` read-only: a read-only bind mount (root) or no write permission."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=120)
        finally:
            folder.chmod(0o755)
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a folder read-only as root")
    line = " ".join(shlex.quote(part) for part in command)
    mount = f"mount --bind -o ro {shlex.quote(str(folder))} {shlex.quote(str(folder))}"
    run = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"{mount} && exec {line}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "mount:" in run.stderr:
        pytest.skip(f"cannot mount read-only here: {run.stderr.strip()}")
    return run


def test_repair_and_show_on_a_read_only_disk_say_so_in_one_line(tmp_path: Path) -> None:
    from searchgym.memory import MemoryStore

    store = MemoryStore(tmp_path / "store")
    for i in range(30):
        store.log("min_tool_calls").append({"id": _question(i), "n": i % 5}, None)
    store.close()
    repair = _read_only(
        tmp_path / "store", [sys.executable, "-m", "searchgym.cli", "memory", "repair", str(store.root)]
    )
    assert repair.returncode == 2 and "Traceback" not in repair.stderr
    assert len(repair.stderr.strip().splitlines()) == 1
    assert "min_tool_calls.sqlite" in repair.stderr
    assert "read-only" in repair.stderr or "may not write" in repair.stderr
    show = _read_only(
        tmp_path / "store", [sys.executable, "-m", "searchgym.cli", "memory", "show", str(store.root)]
    )
    assert show.returncode == 0, show.stderr  # nothing to set up: the store is read as it is
    assert show.stdout.startswith(f"Store {store.root}: 0 trajectories")
    # Commits still in a WAL beside the file (a killed writer) are read too.
    path = store.path_of("min_tool_calls")
    script = (
        "import os\nfrom searchgym.storage import SqliteLog\n"
        f"SqliteLog({path!r}, schema=None).append({{'id': 'x', 'n': 1}})\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert os.path.getsize(f"{path}-wal") > 0
    read = (
        "from searchgym.storage import SqliteLog\n"
        f"print(len(SqliteLog({path!r}, schema=None, readonly=True).read()[0]))\n"
    )
    run = _read_only(tmp_path / "store", [sys.executable, "-c", read])
    assert run.returncode == 0 and run.stdout.split() == ["31"], run.stderr
    repair = _read_only(tmp_path / "store", [sys.executable, "-m", "searchgym.cli", "memory", "repair", path])
    assert repair.returncode == 2 and len(repair.stderr.strip().splitlines()) == 1 and path in repair.stderr


# -- a WAL lost or damaged while no process runs -------------------------------------------------


def _appended_then_killed(path: Path, first: int, then: int) -> None:
    """``first`` records checkpointed into the file, then ``then`` more left in the WAL by a killed writer."""
    log = SqliteLog(path, schema=None)
    for i in range(first):
        log.append({"id": _question(i), "n": i % 7})
    log.close()
    script = (
        "import os\nfrom searchgym.storage import SqliteLog\n"
        f"log = SqliteLog({str(path)!r}, schema=None)\n"
        f"for i in range({first}, {first + then}):\n"
        "    log.append({'id': f'q{i:05d}-' + 'w' * (i % 23), 'n': i % 7})\nos._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_a_deleted_wal_is_reported_with_the_records_it_held(tmp_path: Path) -> None:
    path = tmp_path / "min_tool_calls.sqlite"
    _appended_then_killed(path, 100, 79)
    os.unlink(f"{path}-wal")
    os.unlink(f"{path}-shm")
    with pytest.raises(DataFileError) as error:
        MinToolCallStore(path)
    assert "79 acknowledged records (ids 101-179) are missing" in str(error.value)
    run = _cli("memory", "repair", str(path))
    assert run.returncode == 0, run.stderr
    assert "79 acknowledged records (ids 101-179) were missing" in run.stdout and "79 are lost" in run.stdout
    assert "fine" not in run.stdout
    assert len(MinToolCallStore(path).minima()) == 100  # the store goes on with what it has
    assert "fine" in _cli("memory", "repair", str(path)).stdout  # the loss was reported once


def test_a_damaged_wal_is_reported_and_its_intact_frames_read_back(tmp_path: Path) -> None:
    path = tmp_path / "min_tool_calls.sqlite"
    _appended_then_killed(path, 100, 183)
    wal = Path(f"{path}-wal")
    frame = 24 + _page_size(path)
    with open(wal, "r+b") as handle:  # 64 random bytes in the middle of the 50th frame
        handle.seek(32 + 49 * frame + 300)
        handle.write(os.urandom(64))
    conn = sqlite3.connect(
        f"file:{path}?mode=ro", uri=True
    )  # SQLite drops the frames from the damaged one on
    held = conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    conn.close()
    assert held < 283
    with pytest.raises(DataFileError, match=r"acknowledged records \(ids \d+-283\) are missing"):
        MinToolCallStore(path)
    run = _cli("memory", "repair", str(path))
    assert run.returncode == 0, run.stderr
    assert (
        "were missing" in run.stdout
        and "read back from the intact frames of its WAL; 0 are lost" in run.stdout
    )
    minima = MinToolCallStore(
        path
    ).minima()  # each frame holds its page whole: later ones hold the damaged one's rows
    assert minima == {_question(i): i % 7 for i in range(283)}


def test_a_copy_put_back_in_place_of_the_live_file_is_not_taken_for_a_loss(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "a.sqlite")
    for i in range(10):
        log.append({"i": i})
    log.backup(tmp_path / "copy.sqlite")
    for i in range(10, 20):
        log.append({"i": i})
    log.close()
    os.replace(tmp_path / "copy.sqlite", tmp_path / "a.sqlite")  # a checkpoint's copy put back
    assert [r["i"] for r in SqliteLog(tmp_path / "a.sqlite").read()[0]] == list(range(10))


def test_a_writer_killed_at_any_time_is_never_taken_for_a_loss(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    script = (
        "import os, sys\nfrom searchgym.storage import SqliteLog\n"
        f"log = SqliteLog({str(path)!r})\n"
        "for i in range(100000):\n    log.append({'i': i})\n"
    )
    for delay in (0.3, 0.5, 0.7):
        writer = subprocess.Popen([sys.executable, "-c", script])
        try:
            writer.wait(timeout=2 + delay)
        except subprocess.TimeoutExpired:
            writer.kill()
            writer.wait()
        SqliteLog(path).read()  # no "acknowledged records are missing"


# -- the write-ahead log an append writes --------------------------------------------------------


def test_an_append_writes_one_small_page_to_the_wal(tmp_path: Path) -> None:
    log = log_file(tmp_path / "min_tool_calls.sqlite")
    log.append({"id": "warm-up", "n": 0})
    before = os.path.getsize(f"{log.path}-wal")
    for i in range(200):
        log.append({"id": _question(i), "n": i % 7})
    per_append = (os.path.getsize(f"{log.path}-wal") - before) / 200
    assert per_append < 1.25 * (
        24 + 1024
    )  # one 1 KiB page (and its page splits); no index or id counter page


# -- a -shm file deleted while writers run -------------------------------------------------------

_WRITER = """
import sys
from searchgym.storage import SqliteLog
log = SqliteLog(sys.argv[1])
for i in range(10**9):
    log.append({"w": int(sys.argv[2]), "i": i, "pad": "x" * 300})
"""

_NEWCOMER = """
import sys
from searchgym.error import DataFileError
from searchgym.storage import SqliteLog
log = SqliteLog(sys.argv[1])
try:
    for k in range(300):
        log.read()
        log.append({"w": 9, "i": k})
except DataFileError as error:
    print(error)
"""


def test_a_shm_file_deleted_under_running_writers_keeps_newcomers_out(tmp_path: Path) -> None:
    import time

    path = tmp_path / "a.sqlite"
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(k)]) for k in range(2)]
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(f"{path}-shm") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        os.unlink(f"{path}-shm")
        time.sleep(0.5)
        messages = [
            subprocess.run(
                [sys.executable, "-c", _NEWCOMER, str(path)], capture_output=True, text=True, timeout=120
            ).stdout.strip()
            for _ in range(3)
        ]
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
    said = [m for m in messages if m]
    assert said, "a process that opened the store after the -shm file was deleted saw nothing wrong"
    for message in said:
        assert "-shm was deleted while processes" in message, message
        assert all(str(w.pid) in message for w in writers) and "run `searchgym memory repair" not in message
    # a newcomer that opened it would have written and checkpointed beside them, unseen by their
    # locks, and could damage the file; refused before it connects, it leaves the file sound
    assert all("this process does not open it" in message for message in said), said
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()


def test_the_disk_use_table_is_the_one_generated_from_the_committed_results() -> None:
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("store_wal_bench", root / "benchmarks" / "store_wal.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = json.loads((root / "benchmarks" / "results" / "store_wal.json").read_text(encoding="utf-8"))
    page = (root / "docs" / "stores.md").read_text(encoding="utf-8")
    assert page.split(bench.BEGIN, 1)[1].split(bench.END, 1)[0].strip() == bench.table(results).strip()
    runs = {(r["layout"], r["kind"]): r for r in results["runs"]}
    for kind in ("minimum", "trajectory"):  # what the page says: fewer WAL bytes per append
        assert runs["current", kind]["wal_bytes_per_append"] < runs["older", kind]["wal_bytes_per_append"] / 4
