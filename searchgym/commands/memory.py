"""``searchgym memory``: inspect and repair an experience-memory store.

``searchgym memory show PATH`` prints the current experience bank by group, and HiExp's
records by level (read with ``HierarchicalExperience.load``) when the store holds them;
``--history`` prints every bank version with the step that wrote it, and both list the
corrupt records that reading skipped. ``searchgym memory repair PATH`` checks every file of
the store (the bank, trajectories, updates, LightSearcher's ``min_tool_calls.sqlite``: SQLite's
integrity check, a damaged file rebuilt from what is readable with the original kept; HiExp's
levels file) and keeps every readable record. ``searchgym memory actors`` lists the store
actors living in the Ray cluster (the stores of an OpenRLHF run, or of the built-in trainer
with ``memory.backend: ray``): each one's name, run, process and store paths;
``--kill NAME`` ends one (its files stay).
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

NAME = "memory"
HELP = "show or repair an experience-memory store, or list and end store actors"

_WIDTH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="memory_action", required=True)
    show = actions.add_parser("show", help="print the current bank (and HiExp levels) of a store")
    show.add_argument("path", help="the store folder (ExperienceMemory(path=...))")
    show.add_argument("--history", action="store_true", help="print every bank version with its step")
    repair = actions.add_parser(
        "repair", help="check and repair every store file, keeping every readable record"
    )
    repair.add_argument(
        "path", help="the store folder, or a minimum tool-call store file (reward_kwargs.store)"
    )
    actors = actions.add_parser(
        "actors", help="list the store actors living in a Ray cluster, or end one (--kill NAME)"
    )
    actors.add_argument("--kill", metavar="NAME", help="end the store actor NAME (its files stay)")
    actors.add_argument(
        "--ray-address",
        help="the Ray cluster (default: $RAY_ADDRESS, else the cluster `ray start` runs on this machine)",
    )


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, width=_WIDTH, initial_indent=indent + "- ", subsequent_indent=indent + "  ")


def _print_bank(bank: Any, indent: str = "  ") -> None:
    for heading, items in bank.groups():
        print(f"{indent}{heading}:")
        if not items:
            print(f"{indent}  (none)")
        for item in items:
            print(_wrap(item, indent + "  "))


def _describe(record: Any) -> str:
    start, end = record.window
    return (
        f"version {record.bank.version}, step {record.bank.step}: {record.summarizer}, "
        f"{record.good} Good / {record.bad} Bad of trajectories {start}-{end}"
    )


def _print_levels(hierarchy: Any) -> None:
    print(f"HiExp levels ({len(hierarchy)} records):")
    for level, records in sorted(hierarchy.levels.items(), reverse=True):
        print(f"  Level {level} ({len(records)} record{'s' if len(records) != 1 else ''}):")
        for r in records:
            tags = f" [{', '.join(r.tags)}]" if r.tags else ""
            print(_wrap(f"({r.type}) {r.title}{tags}", "    "))
            if r.description:
                print(
                    textwrap.fill(
                        r.description,
                        width=_WIDTH,
                        initial_indent="        ",
                        subsequent_indent="        ",
                    )
                )


def _show(args: argparse.Namespace) -> int:
    from searchgym.memory import HierarchicalExperience, MemoryStore, read_bank_history
    from searchgym.storage.diagnose import write_problem

    # A store that cannot be written (a read-only disk) is read without setting anything up.
    store = MemoryStore(args.path, create=False, readonly=write_problem(f"{args.path}/x") is not None)
    present = store.kinds_present()
    if not present:
        print(f"{store.root}: an empty store (no store files yet).")
        return 0
    history = read_bank_history(store) if "bank" in present else []
    trajectories = store.log("trajectories").count() if "trajectories" in present else 0
    print(f"Store {store.root}: {trajectories} trajectories, {len(history)} bank versions.")
    if args.history:
        for record in history:
            print(f"\nBank {_describe(record)}")
            _print_bank(record.bank)
    if history:
        print(f"\nCurrent bank ({_describe(history[-1])}):")
        _print_bank(history[-1].bank)
    elif "bank" in present or "trajectories" in present:
        print("\nNo bank yet: no update has found both Good and Bad trajectories.")
    if "updates" in present:
        updates = store.log("updates").read()[0]
        if updates and updates[-1]["outcome"] != "written":
            last = updates[-1]
            print(f"\nLast update (step {last['step']}) {last['outcome']}: {last['reason']}.")
    if "hiexp_levels" in present:
        print()
        _print_levels(HierarchicalExperience.load(store.path_of("hiexp_levels")))
    _print_skipped(store, present)
    return 0


def _print_skipped(store: Any, present: list[str]) -> None:
    """The corrupt records (and HiExp lines) that reading skipped."""
    from searchgym.memory.hiexp.levels_file import read_records

    skipped = [
        (store.log(k).path, f"record {row}", why)
        for k in present
        if k != "hiexp_levels"
        for row, why in store.log(k).corrupt
    ]
    if "hiexp_levels" in present:
        file = store.root / "hiexp_levels.jsonl"
        skipped += [(str(file), f"line {number}", why) for number, why in read_records(file)[1]]
    if not skipped:
        return
    print(
        f"\nSkipped {len(skipped)} corrupt record(s); run `searchgym memory repair {store.root}` to remove them:"
    )
    for path, where, why in skipped[:20]:
        print(f"  {path}, {where}: {why}")


def _repair(args: argparse.Namespace) -> int:
    import os

    from searchgym.memory import MemoryStore
    from searchgym.memory.store import log_file

    if os.path.isfile(args.path):
        reports = [log_file(args.path).repair()]
    else:
        store = MemoryStore(args.path, create=False)
        reports = store.repair()
        if not reports:
            print(f"{store.root}: nothing to repair (no store files).")
    for report in reports:
        lines = report.path.endswith("hiexp_levels.jsonl")  # HiExp's file; the rest are SQLite logs
        if not report.changed:
            print(f"{report.path}: fine ({report.kept} records).")
            continue
        if report.problems:
            print(
                f"{report.path}: damaged ({'; '.join(report.problems[:3])}); rebuilt with the {report.kept} "
                f"readable records, the original kept as {report.original}."
            )
        if report.missing:
            first, last = report.missing
            count = last - first + 1
            plural = "s" if count != 1 else ""
            if report.problems:  # the rebuild read the file and its WAL: the rest is unreadable
                print(
                    f"{report.path}: the {count} acknowledged record{plural} after the highest readable id "
                    f"(ids {first}-{last}) could not be read from the damaged file; they are lost."
                )
            else:
                read_back = (
                    f"; {report.salvaged} read back from the intact frames of its WAL"
                    if report.salvaged
                    else ""
                )
                copies = f" (WAL copies kept: {', '.join(report.wal_copies)})" if report.wal_copies else ""
                print(
                    f"{report.path}: {count} acknowledged record{plural} (ids {first}-{last}) were missing: its "
                    f"write-ahead log was deleted or damaged, or the file replaced by an older copy{read_back}; "
                    f"{report.lost} {'are' if report.lost != 1 else 'is'} lost{copies}."
                )
        if report.dropped:
            where = f"{report.path}.corrupt" if lines else "its 'rejected' table"
            print(
                f"{report.path}: kept {report.kept} records, moved out {len(report.dropped)} corrupt ones "
                f"(kept in {where})."
            )
        for line, reason in report.dropped[:20]:
            print(f"  {'line' if lines else 'record'} {line}: {reason}")
        if len(report.dropped) > 20:
            print(f"  ... and {len(report.dropped) - 20} more")
    return 0


def _connect(address: str | None) -> None:
    import logging
    import os

    from searchgym.error import SearchGymError

    try:
        import ray
    except ModuleNotFoundError:
        raise SearchGymError(
            "`searchgym memory actors` needs Ray: pip install 'searchgym[ray]'. Without Ray there are no store actors."
        ) from None
    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except ConnectionError as exc:
        raise SearchGymError(
            f"No Ray cluster at {address!r} ({str(exc).splitlines()[0]}); give --ray-address HOST:6379 (or set "
            "RAY_ADDRESS). With no cluster running, no store actor lives."
        ) from None


def _actors(args: argparse.Namespace) -> int:
    import ray

    from searchgym.trainers.store_actors import kill_store_actor, list_store_actors

    _connect(args.ray_address)
    try:
        if args.kill:
            actor = kill_store_actor(args.kill)
            paths = ", ".join(sorted(actor.paths())) or "its store"
            print(f"Ended the store actor {actor.name} ({actor.who()}); its files stay at {paths}.")
            return 0
        actors = list_store_actors()
        if not actors:
            print("No store actor lives in this Ray cluster.")
            return 0
        for actor in actors:
            print(f"{actor.name}: {actor.who()}")
            if actor.memory_path:
                settings = ", ".join(f"{k} {v}" for k, v in sorted(actor.settings.items()))
                print(f"  memory {actor.memory_path}" + (f" ({settings})" if settings else ""))
            if actor.min_tool_calls_path:
                print(f"  minimum tool calls {actor.min_tool_calls_path}")
        print("End one with `searchgym memory actors --kill NAME` (a running run's actor ends with it).")
        return 0
    finally:
        ray.shutdown()


def run(args: argparse.Namespace) -> int:
    if args.memory_action == "actors":
        return _actors(args)
    return _show(args) if args.memory_action == "show" else _repair(args)
